# Forgetting through the DAG, and the unlearning study (Figure 1 of the TAFT paper).
#
# Every shard's training set is its own manifest `split/n{N}_s{seed}/shard{i}.parquet`, whose
# params are its members minus the forgotten ids that fall in shard i (known at DAG-build time:
# the samples table and the keyed-hash split are pure functions of the config and the dataset
# listing). A forget request, or new or removed data, therefore changes the params of the
# affected shards' manifest jobs only, and Snakemake reruns those jobs and their dependants
# (training, composition, evaluation, report) and nothing else.
from pipeline_src.plan.forget import check_forget_section, forgotten_in_shard, shard_members, unlearning_targets

try:  # the request as a whole, before any job runs (a no-op repeat if config.py already ran it)
    check_forget_section(config)
except ConfigError as err:
    raise WorkflowError(f"Invalid config: {err}") from None

FORGET = config["forget"]
STUDY = FORGET["study"]


localrules:
    forget_manifest,


rule forget_manifest:
    output:  # no input files: the members are params, so only shards whose members change rerun
        manifest=f"{R}/split/n{{shards}}_s{{seed}}/shard{{shard}}.parquet",
    log:
        f"{R}/logs/forget_manifest/n{{shards}}_s{{seed}}/shard{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        members=lambda w: shard_members(config, int(w.shards), int(w.seed), int(w.shard)),
        forgotten=lambda w: forgotten_in_shard(config, int(w.shards), int(w.seed), int(w.shard)),
        settings=step_settings("forget_manifest"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


# ---------------------------------------------------------------- the study
rule unlearn_drop:
    input:
        unpack(unlearn_drop_inputs),
    output:
        metrics=f"{R}/metrics/unlearn_drop/{{method}}/n{{shards}}_s{{seed}}.parquet",
        per_image=f"{R}/per_image/unlearn_drop/{{method}}/n{{shards}}_s{{seed}}.parquet",
        models=directory(f"{R}/unlearn_drop/{{method}}/n{{shards}}_s{{seed}}"),
    log:
        f"{R}/logs/unlearn_drop/{{method}}/n{{shards}}_s{{seed}}.log",
    conda:
        "../envs/pipeline.yaml"
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
    params:
        removed_shards=STUDY["removed_shards"],
        requests=STUDY["requests_per_point"],
        settings=step_settings("unlearn_drop"),
        selected_at=lambda w: selected_point(w.method, w.shards),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule unlearn_retrain:
    input:
        unpack(unlearn_retrain_inputs),
    output:
        metrics=f"{R}/metrics/unlearn_retrain/{{method}}/n{{shards}}_s{{seed}}/f{{fraction}}_r{{request}}.parquet",
        per_image=f"{R}/per_image/unlearn_retrain/{{method}}/n{{shards}}_s{{seed}}/f{{fraction}}_r{{request}}.parquet",
        models=directory(f"{R}/unlearn_retrain/{{method}}/n{{shards}}_s{{seed}}/f{{fraction}}_r{{request}}"),
    log:
        f"{R}/logs/unlearn_retrain/{{method}}/n{{shards}}_s{{seed}}/f{{fraction}}_r{{request}}.log",
    wildcard_constraints:
        fraction=r"[0-9.e-]+",
        request=r"\d+",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        signature=training_signature,
        settings=step_settings("unlearn_retrain"),
        selected_at=lambda w: selected_point(w.method, w.shards),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule unlearn_paragon:
    input:
        unpack(unlearn_paragon_inputs),
    output:
        metrics=f"{R}/metrics/unlearn_paragon/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.parquet",
        per_image=f"{R}/per_image/unlearn_paragon/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.parquet",
        model=f"{R}/unlearn_paragon/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.safetensors",
        record=f"{R}/unlearn_paragon/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.json",
    log:
        f"{R}/logs/unlearn_paragon/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.log",
    wildcard_constraints:
        fraction=r"[0-9.e-]+",
        request=r"\d+",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        signature=training_signature,
        settings=step_settings("unlearn_paragon"),
        selected_at=lambda w: selected_point(w.method, 1),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule unlearn_paragon_nonlinear:
    input:
        unpack(unlearn_paragon_nonlinear_inputs),
    output:
        metrics=f"{R}/metrics/unlearn_paragon_nonlinear/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.parquet",
        per_image=f"{R}/per_image/unlearn_paragon_nonlinear/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.parquet",
        model=f"{R}/unlearn_paragon_nonlinear/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.safetensors",
        record=f"{R}/unlearn_paragon_nonlinear/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.json",
    log:
        f"{R}/logs/unlearn_paragon_nonlinear/{{method}}/s{{seed}}/f{{fraction}}_r{{request}}.log",
    wildcard_constraints:
        fraction=r"[0-9.e-]+",
        request=r"\d+",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        signature=nonlinear_paragon_signature,
        nonlinear=True,
        settings=step_settings("unlearn_paragon_nonlinear"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


UNLEARNING_METRICS = unlearning_targets(config, R)
STUDY_METRICS.extend(UNLEARNING_METRICS)


rule unlearning:
    input:
        UNLEARNING_METRICS,
