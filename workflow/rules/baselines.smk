# References that need no pretraining (config `baselines:`), on the study's own target images, their
# rows in the metrics schema beside the methods' (issue 31), and their per-image test records, so the
# claims' paired tests can compare a method with them (issue 42). The from-scratch model of the backbone's
# architecture is a method (`{kind: full, init: random}`), trained under the same protocol as the others.
rule baseline_pixel_logreg:
    input:
        samples=f"{R}/prepare/samples.parquet",
        images=f"{R}/prepare/images.npy",
    output:
        metrics=f"{R}/metrics/baselines/pixel_logreg.parquet",
        per_image=f"{R}/per_image/baselines/pixel_logreg.parquet",
    log:
        f"{R}/logs/baselines/pixel_logreg.log",
    conda:
        "../envs/pipeline.yaml"
    threads: 1
    resources:
        mem_mb=mem_per_attempt(2000),
    params:
        settings=step_settings("baseline_pixel_logreg"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


# A small CNN from random init under the methods' protocol and learning-rate search (issue 42 §3):
# one job per run seed (the seed varies its init and batch order), each choosing its rate on val.
rule baseline_small_cnn:
    input:
        samples=f"{R}/prepare/samples.parquet",
        images=f"{R}/prepare/images.npy",
    output:
        metrics=f"{R}/metrics/baselines/small_cnn/s{{seed}}.parquet",
        per_image=f"{R}/per_image/baselines/small_cnn/s{{seed}}.parquet",
    log:
        f"{R}/logs/baselines/small_cnn/s{{seed}}.log",
    conda:
        "../envs/pipeline.yaml"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    params:
        settings=step_settings("baseline_small_cnn"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


BASELINE_METRICS = [f"{R}/metrics/baselines/pixel_logreg.parquet"] if config["baselines"]["pixel_logreg"] else []
BASELINE_METRICS += (
    [f"{R}/metrics/baselines/small_cnn/s{s}.parquet" for s in SEEDS] if config["baselines"]["small_cnn"] else []
)
STUDY_METRICS.extend(BASELINE_METRICS)
