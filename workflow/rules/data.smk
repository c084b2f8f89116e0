rule prepare:
    output:
        samples=f"{R}/prepare/samples.parquet",
        images=f"{R}/prepare/images.npy",
    log:
        f"{R}/logs/prepare/prepare.log",
    priority: 10  # the chain every model job waits on: first
    conda:
        "../envs/pipeline.yaml"
    threads: 2  # decoding threads
    params:
        signature=json.dumps({"dataset": dataset_signature(config), "seed": config["seed"]}, sort_keys=True),
        listing=dataset_listing_digest,
        settings=step_settings("prepare"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


localrules:
    signature,


rule signature:
    output:
        signature=signature_path("{name}"),
    log:
        f"{R}/logs/signature/{{name}}.log",
    priority: 10  # the chain every model job waits on: first
    conda:
        "../envs/pipeline.yaml"
    params:
        value=lambda w: signature_value(w.name),
        settings=step_settings("signature"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule pretrain:
    input:  # ancient: new target-task data must not retrain the backbone; the signature covers its data
        samples=ancient(f"{R}/prepare/samples.parquet"),  # a new string: ancient() flags its argument in place
        upstream=signature_path("upstream"),
    output:
        model=f"{R}/pretrain/model.safetensors",
        record=f"{R}/pretrain/backbone.json",
        source_ids=f"{R}/pretrain/source_ids.txt",  # private: the ids the backbone saw (never exported)
        metrics=f"{R}/metrics/pretrain/backbone.parquet",
    log:
        f"{R}/logs/pretrain/pretrain.log",
    priority: 10  # the chain every model job waits on: first
    conda:
        "../envs/pipeline.yaml"
    threads: 2
    resources:
        mem_mb=mem_per_attempt(4000),
        gpu=RES["gpu"],
    params:
        signature=json.dumps({"backbone": config["backbone"], "seed": config["seed"]}, sort_keys=True),
        settings=step_settings("pretrain"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)
