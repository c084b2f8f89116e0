rule features:
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
    output:
        features=f"{R}/features/{{cache}}/features.safetensors",
    log:
        f"{R}/logs/features/{{cache}}.log",
    benchmark:
        f"{R}/logs/features/{{cache}}.bench.tsv"
    threads: 2
    resources:
        mem_mb=4000,
        gpu=RES["gpu"],
    script:
        "../scripts/features.py"


rule train:
    input:
        unpack(train_inputs),
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
