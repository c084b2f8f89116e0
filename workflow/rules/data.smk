rule prepare:
    output:
        samples=f"{R}/prepare/samples.parquet",
        images=f"{R}/prepare/images.safetensors",
    params:
        signature=json.dumps({"dataset": config["dataset"], "seed": config["seed"]}, sort_keys=True),
    log:
        f"{R}/logs/prepare/prepare.log",
    benchmark:
        f"{R}/logs/prepare/prepare.bench.tsv"
    script:
        "../scripts/step.py"


rule pretrain:
    input:
        samples=rules.prepare.output.samples,
    output:
        model=f"{R}/pretrain/model.safetensors",
        record=f"{R}/pretrain/backbone.json",
        metrics=f"{R}/metrics/pretrain/backbone.parquet",
    params:
        signature=json.dumps({"backbone": config["backbone"], "seed": config["seed"]}, sort_keys=True),
    log:
        f"{R}/logs/pretrain/pretrain.log",
    benchmark:
        f"{R}/logs/pretrain/pretrain.bench.tsv"
    threads: 2
    resources:
        mem_mb=mem_per_attempt(4000),
        gpu=RES["gpu"],
    script:
        "../scripts/step.py"


rule split:
    input:
        samples=rules.prepare.output.samples,
    output:
        manifest=f"{R}/split/n{{shards}}_s{{seed}}/manifest.parquet",
    log:
        f"{R}/logs/split/n{{shards}}_s{{seed}}.log",
    benchmark:
        f"{R}/logs/split/n{{shards}}_s{{seed}}.bench.tsv"
    script:
        "../scripts/step.py"
