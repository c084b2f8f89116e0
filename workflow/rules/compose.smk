rule compose:
    input:
        models=shard_models,
    output:
        model=f"{R}/compose/{{method}}/n{{shards}}_s{{seed}}/soup.safetensors",
        record=f"{R}/compose/{{method}}/n{{shards}}_s{{seed}}/soup.json",
    log:
        f"{R}/logs/compose/{{method}}/n{{shards}}_s{{seed}}/soup.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        settings=step_settings("compose"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)
