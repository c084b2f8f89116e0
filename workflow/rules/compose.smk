rule compose:
    input:
        models=shard_models,
    output:
        model=f"{R}/compose/{{method}}/n{{shards}}_s{{seed}}/soup.safetensors",
        record=f"{R}/compose/{{method}}/n{{shards}}_s{{seed}}/soup.json",
    log:
        f"{R}/logs/compose/{{method}}/n{{shards}}_s{{seed}}/soup.log",
    benchmark:
        f"{R}/logs/compose/{{method}}/n{{shards}}_s{{seed}}/soup.bench.tsv"
    conda:
        "../envs/pipeline.yaml"
    params:
        settings=step_settings("compose"),
    script:
        "../scripts/step.py"
