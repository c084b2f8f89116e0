# The privacy study (TAFT paper §3.4, Table 3): DP training per protocol x method x regime x
# epsilon x shard count x shard x seed from the cached features, DP taft shards composed by their
# Δw sum, every DP model evaluated. Protocol ours: Poisson DP-SGD; paper: the TAFT paper's
# full-batch DP-GD (App. A), see pipeline_src/plan/privacy.py. Its metrics join STUDY_METRICS
# (common.smk) when privacy.enabled, so `report` (and `all`) build them; `snakemake privacy` builds
# them alone. The input, params and signature functions are in study_inputs.smk.
from pipeline_src.plan.privacy import (
    PROTOCOLS,
    private_evaluation_targets,
    release_model_files,
    target_epsilon,
)


wildcard_constraints:
    regime="full|bitfit|layernorm|fc",
    protocol="|".join(PROTOCOLS),
    eps=r"[0-9][0-9.e+-]*",
    dp_model=r"shard\d+|soup|ensemble",


PRIVATE_METRICS_ALL = private_evaluation_targets(config, R)
if config["privacy"]["enabled"]:
    STUDY_METRICS.extend(PRIVATE_METRICS_ALL)


rule privacy:
    input:
        PRIVATE_METRICS_ALL,


# The releasable folder of a DP study (docs/privacy.md): the exported DP models and a DP-only
# report (Table 3 rows, ε, δ, σ, q, steps, C), nothing that counts images, times jobs or depends on
# non-DP training. `results/report/` is private workspace.
rule release:
    input:
        metrics=PRIVATE_METRICS_ALL,
        models=release_model_files(PRIVATE_METRICS_ALL, R),
        backbone=f"{R}/pretrain/model.safetensors",
    output:
        release=directory(f"{R}/release"),
    log:
        f"{R}/logs/release/release.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        settings=step_settings("release"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule train_private:
    input:
        unpack(lambda w: shard_job_inputs(w, f"private-{w.protocol}-{w.method}", PRIVATE_AXES)),
    output:
        model=f"{PRIVATE}/shard{{shard}}.safetensors",
        record=f"{PRIVATE}/shard{{shard}}.json",
    log:
        f"{R}/logs/train_private/{PRIVATE_LOG}/shard{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        signature=private_signature,
        epsilon=lambda w: target_epsilon(config, w.eps),
        settings=step_settings("train_private"),
        selected_at=lambda w: selected_point(w.method, w.shards, PRIVATE_AXES),  # taft: CLS (the DP search picks PT)
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule compose_private:
    input:
        models=private_shard_models,
    output:
        model=f"{PRIVATE}/soup.safetensors",
        record=f"{PRIVATE}/soup.json",
    log:
        f"{R}/logs/compose_private/{PRIVATE_LOG}/soup.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        settings=step_settings("compose_private"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule evaluate_private:
    input:
        unpack(private_evaluation_inputs),
    output:
        metrics=f"{PRIVATE_METRICS}/{{dp_model}}.parquet",
        per_image=f"{R}/per_image/private/{PRIVATE_LOG}/{{dp_model}}.parquet",  # test images: never members
    log:
        f"{R}/logs/evaluate_private/{PRIVATE_LOG}/{{dp_model}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        model=lambda w: "dp-shard" if w.dp_model.startswith("shard") else f"dp-{w.dp_model}",
        shard_id=lambda w: int(w.dp_model.removeprefix("shard")) if w.dp_model.startswith("shard") else None,
        settings=step_settings("evaluate_private"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)
