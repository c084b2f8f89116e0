# The LAST grid study (config `last_grid:`): one job per shard count N and seed trains a grid of
# LAST side networks (lrs x ranks x heads x every x modules_per_block x init_seeds on the base
# `last` method) at once on shard 0's cached 'blocks' features and evaluates each on val and test.
# Its metrics files are appended to STUDY_METRICS, so `report` (and `all`) build them when
# `last_grid.enabled` is true. Checked at validation (pipeline_src/plan/config.py).
from pipeline_src.plan.last_grid import last_grid_targets


rule last_grid:
    input:
        unpack(last_grid_inputs),
    output:
        metrics=f"{R}/metrics/last_grid/{{method}}/n{{shards}}_s{{seed}}.parquet",
    log:
        f"{R}/logs/last_grid/{{method}}/n{{shards}}_s{{seed}}.log",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        signature=last_grid_signature,
        settings=step_settings("last_grid"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


LAST_GRID_METRICS = last_grid_targets(config, R)
STUDY_METRICS.extend(LAST_GRID_METRICS)


rule last_grid_study:
    input:
        LAST_GRID_METRICS,
