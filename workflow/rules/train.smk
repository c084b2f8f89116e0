rule features:
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
    output:
        features=f"{R}/features/{{cache}}/features.npy",
        meta=f"{R}/features/{{cache}}/features.json",
    log:
        f"{R}/logs/features/{{cache}}.log",
    priority: 10  # every cached-feature job waits on it, and 2 threads wait for both cores: late, it left one idle
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
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule train:
    input:
        unpack(lambda w: shard_job_inputs(w, f"train-{w.method}")),
    output:
        model=f"{R}/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.safetensors",
        record=f"{R}/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.json",
    log:
        f"{R}/logs/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.log",
    wildcard_constraints:
        # every shard file except those the vectorized jobs below write
        method=train_method_constraint(METHODS, VECTORIZED_JOBS),
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        signature=training_signature,
        settings=step_settings("train"),
        selected_at=lambda w: selected_point(w.method, w.shards),  # the `selection` input's choice it trains at
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


# The first training of a (method, N) with `vectorized_shards` is one job per seed that trains
# every shard no forget request touches, vectorized over shards; a touched shard retrains alone
# in `train` above (`plan/vectorized.py`). One rule per (method, N, seed): its outputs are fixed.
for _method, _n, _seed, _trained in VECTORIZED_JOBS:

    rule:
        name:
            f"train_vectorized_{_method}_n{_n}_s{_seed}"
        input:
            unpack(lambda w, m=_method, n=_n, s=_seed, t=_trained: vectorized_job_inputs(m, n, s, t)),
        output:
            models=[f"{R}/train/{_method}/n{_n}_s{_seed}/shard{i}.safetensors" for i in _trained],
            records=[f"{R}/train/{_method}/n{_n}_s{_seed}/shard{i}.json" for i in _trained],
        log:
            f"{R}/logs/train/{_method}/n{_n}_s{_seed}/vectorized.log",
        conda:
            "../envs/pipeline.yaml"
        threads: RES["train_threads"]
        resources:
            mem_mb=mem_per_attempt(RES["train_mem_mb"]),
            gpu=RES["gpu"],
        params:
            # not the shards it trains: a forget request must not change this job's params
            signature=lambda w, m=_method: signature_of(m),
            settings=lambda w, m=_method, n=_n, s=_seed: settings_for(
                "train_vectorized", config, {"method": m, "shards": str(n), "seed": str(s)}
            ),
            method=_method,
            shards=_n,
            seed=_seed,
            selected_at=lambda w, m=_method, n=_n: selected_point(m, n),
        run:
            run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)
