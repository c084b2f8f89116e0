rule train:
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
        manifest=rules.split.output.manifest,
    output:
        model=f"{R}/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.safetensors",
        record=f"{R}/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.json",
    params:
        signature=training_signature,
    log:
        f"{R}/logs/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.log",
    benchmark:
        f"{R}/logs/train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.bench.tsv"
    threads: RES["train_threads"]
    resources:
        mem_mb=RES["train_mem_mb"],
        gpu=RES["gpu"],
    script:
        "../scripts/train.py"
