# One metrics file per (method, N, seed) for its shard models and their ensemble, and one for the soup;
# beside each, its models' per-image test correctness (`per_image`, for the claims' paired tests).


rule evaluate_shards:
    # All N shard models of one (method, N, seed) in one job: one pass over the test split, the
    # frozen prefix run once per batch for all of them. Its file holds each shard model's rows
    # and, for N > 1 with `ensemble` among the compositions, their ensemble's. A forget request
    # that retrains one shard reruns this job (evaluation is cheap next to training).
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
        models=shard_models,
    output:
        metrics=f"{R}/metrics/evaluate/{{method}}/n{{shards}}_s{{seed}}/shards.parquet",
        per_image=f"{R}/per_image/evaluate/{{method}}/n{{shards}}_s{{seed}}/shards.parquet",
    log:
        f"{R}/logs/evaluate/{{method}}/n{{shards}}_s{{seed}}/shards.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        model="shards",
        ensemble=lambda w: evaluates_ensemble(w.shards),
        settings=step_settings("evaluate_shards"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule evaluate_soup:
    input:
        samples=rules.prepare.output.samples,
        backbone=rules.pretrain.output.model,
        models=[rules.compose.output.model],
    output:
        metrics=f"{R}/metrics/evaluate/{{method}}/n{{shards}}_s{{seed}}/soup.parquet",
        per_image=f"{R}/per_image/evaluate/{{method}}/n{{shards}}_s{{seed}}/soup.parquet",
    log:
        f"{R}/logs/evaluate/{{method}}/n{{shards}}_s{{seed}}/soup.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        model="soup",
        settings=step_settings("evaluate_soup"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)
