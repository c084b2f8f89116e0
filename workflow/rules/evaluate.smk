# One metrics file per evaluated model: a shard model, the soup, or the ensemble of shards.


rule evaluate_shard:
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
        models=[rules.train.output.model],
    output:
        metrics=f"{R}/metrics/evaluate/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.parquet",
    log:
        f"{R}/logs/evaluate/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.log",
    benchmark:
        f"{R}/logs/evaluate/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.bench.tsv"
    conda:
        "../envs/pipeline.yaml"
    params:
        model="shard",
        shard_id=lambda w: int(w.shard),
        settings=step_settings("evaluate_shard"),
    script:
        "../scripts/step.py"


rule evaluate_soup:
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
        models=[rules.compose.output.model],
    output:
        metrics=f"{R}/metrics/evaluate/{{method}}/n{{shards}}_s{{seed}}/soup.parquet",
    log:
        f"{R}/logs/evaluate/{{method}}/n{{shards}}_s{{seed}}/soup.log",
    benchmark:
        f"{R}/logs/evaluate/{{method}}/n{{shards}}_s{{seed}}/soup.bench.tsv"
    conda:
        "../envs/pipeline.yaml"
    params:
        model="soup",
        settings=step_settings("evaluate_soup"),
    script:
        "../scripts/step.py"


rule evaluate_ensemble:
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
        models=shard_models,
    output:
        metrics=f"{R}/metrics/evaluate/{{method}}/n{{shards}}_s{{seed}}/ensemble.parquet",
    log:
        f"{R}/logs/evaluate/{{method}}/n{{shards}}_s{{seed}}/ensemble.log",
    benchmark:
        f"{R}/logs/evaluate/{{method}}/n{{shards}}_s{{seed}}/ensemble.bench.tsv"
    conda:
        "../envs/pipeline.yaml"
    params:
        model="ensemble",
        settings=step_settings("evaluate_ensemble"),
    script:
        "../scripts/step.py"
