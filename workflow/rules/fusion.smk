# The fusion study (config `fusion:`): shard models of nlft/last methods are matched to shard 0
# (none | permutation | rotation | rotation-scaling), then fused (soup | fisher | regmean) and
# evaluated. `init` is `shared` (the study's shard models) or `random_reinit` (shard models whose
# tuned blocks start from per-shard random inits, trained by `fusion_train`). Its metrics files are
# appended to STUDY_METRICS, so `report` (and `all`) build them when `fusion.enabled` is true.
from pipeline_src.plan.fusion import FUSIONS, INITS, MATCHINGS, FusionConfigError, check_fusion_config, fusion_targets

try:
    check_fusion_config(config)
except FusionConfigError as err:
    raise WorkflowError(f"Invalid config: {err}") from None

FUSION_WILDCARDS = dict(init="|".join(INITS), matching="|".join(MATCHINGS), fusion="|".join(FUSIONS))
FUSION_RUN = "{init}/{method}/n{shards}_s{seed}"


rule fusion_train:
    input:
        unpack(fusion_train_inputs),
    output:
        model=f"{R}/fusion_train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.safetensors",
        record=f"{R}/fusion_train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.json",
    log:
        f"{R}/logs/fusion_train/{{method}}/n{{shards}}_s{{seed}}/shard{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        signature=training_signature,
        settings=step_settings("fusion_train"),
        selected_at=lambda w: selected_point(w.method, w.shards),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule fusion_match:
    input:
        unpack(fusion_match_inputs),
    output:
        models=directory(f"{R}/fusion_match/{FUSION_RUN}/{{matching}}"),
        metrics=f"{R}/metrics/fusion_match/{FUSION_RUN}/{{matching}}.parquet",
    log:
        f"{R}/logs/fusion_match/{FUSION_RUN}/{{matching}}.log",
    wildcard_constraints:
        **FUSION_WILDCARDS,
    conda:
        "../envs/pipeline.yaml"
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        settings=step_settings("fusion_match"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule fuse:
    input:
        unpack(fusion_common_inputs),
        models=rules.fusion_match.output.models,
    output:
        model=f"{R}/fuse/{FUSION_RUN}/{{matching}}/{{fusion}}.safetensors",
        record=f"{R}/fuse/{FUSION_RUN}/{{matching}}/{{fusion}}.json",
        metrics=f"{R}/metrics/fuse/{FUSION_RUN}/{{matching}}/{{fusion}}.parquet",
        per_image=f"{R}/per_image/fuse/{FUSION_RUN}/{{matching}}/{{fusion}}.parquet",
    log:
        f"{R}/logs/fuse/{FUSION_RUN}/{{matching}}/{{fusion}}.log",
    wildcard_constraints:
        **FUSION_WILDCARDS,
    conda:
        "../envs/pipeline.yaml"
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        settings=step_settings("fuse"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


FUSION_METRICS = fusion_targets(config, R)
STUDY_METRICS.extend(FUSION_METRICS)


rule fusion_study:
    input:
        FUSION_METRICS,
