# The ablation study (studies.ablations; TAFT Fig. 2 and Table 12): one job per variant of a taft
# method and seed trains it on the whole training split and evaluates it on test. Off by default.
from pipeline_src.plan.ablations import ablation_points, ablation_targets

ABL = config["studies"]["ablations"]
ABLATION_POINTS = ablation_points(config) if ABL["enabled"] else {}


ABLATION_METRICS = ablation_targets(config, R)
STUDY_METRICS.extend(ABLATION_METRICS)


rule ablations:
    input:
        ABLATION_METRICS,


rule ablation:
    input:
        unpack(ablation_inputs),
    output:
        metrics=f"{R}/metrics/ablation/{{method}}/{{variant}}/s{{seed}}.parquet",
    log:
        f"{R}/logs/ablation/{{method}}/{{variant}}/s{{seed}}.log",
    wildcard_constraints:
        variant="|".join(ABLATION_POINTS) or "none",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        point=lambda w: ABLATION_POINTS[w.variant],
        settings=step_settings("ablation"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)
