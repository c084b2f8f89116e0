rule features:
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
    output:
        features=f"{R}/features/{{cache}}/features.npy",
        meta=f"{R}/features/{{cache}}/features.json",
    log:
        f"{R}/logs/features/{{cache}}.log",
    benchmark:
        f"{R}/logs/features/{{cache}}.bench.tsv"
    conda:
        "../envs/pipeline.yaml"
    threads: 2
    resources:
        mem_mb=mem_per_attempt(4000),
        gpu=RES["gpu"],
    params:
        # blocks cache: the LAST spacings g whose block outputs it keeps
        everys=lambda w: side_everys(config) if w.cache == "blocks" else None,
        settings=step_settings("features"),  # dtype, and precision: bfloat16 autocast on CUDA changes the values
    script:
        "../scripts/step.py"


rule train:
    input:
        unpack(lambda w: shard_job_inputs(w, f"train-{w.method}")),
    output:
        model=f"{R}/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.safetensors",
        record=f"{R}/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.json",
    log:
        f"{R}/logs/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.log",
    benchmark:
        f"{R}/logs/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.bench.tsv"
    wildcard_constraints:
        method="|".join(m for m in METHODS if m not in VECTORIZED_METHODS) or "(?!)",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        signature=training_signature,
        settings=step_settings("train"),
    script:
        "../scripts/step.py"


# Methods with `vectorized_shards: true` train all N shard models in one job (one rule per
# method and N, since a rule's number of outputs is fixed); the others use `train` above.
for _method in VECTORIZED_METHODS:
    for _n in SHARDS:

        rule:
            name:
                f"train_vectorized_{_method}_n{_n}"
            input:
                unpack(lambda w, m=_method, n=_n: train_inputs_of(m, n, w.seed)),
            output:
                models=[f"{R}/train/{_method}/n{_n}_s{{seed}}/shard{i}.safetensors" for i in range(_n)],
                records=[f"{R}/train/{_method}/n{_n}_s{{seed}}/shard{i}.json" for i in range(_n)],
            log:
                f"{R}/logs/train/{_method}/n{_n}_s{{seed}}/vectorized.log",
            benchmark:
                f"{R}/logs/train/{_method}/n{_n}_s{{seed}}/vectorized.bench.tsv"
            conda:
                "../envs/pipeline.yaml"
            threads: RES["train_threads"]
            resources:
                mem_mb=mem_per_attempt(RES["train_mem_mb"]),
                gpu=RES["gpu"],
            params:
                signature=lambda w, m=_method: signature_of(m),
                settings=lambda w, m=_method: settings_for("train_vectorized", config, {**dict(w.items()), "method": m}),
                method=_method,
                shards=_n,
            script:
                "../scripts/step.py"
