import glob

from pipeline_src.plan.per_image_files import per_image_files


rule report:
    input:
        lambda w: [*evaluation_targets(), rules.pretrain.output.metrics, *STUDY_METRICS],
        # the claims' per-image records (plan/per_image_files.py): the claims table reads them
        per_image=lambda w: per_image_files([*evaluation_targets(), *STUDY_METRICS], R),
        # Benchmark rows present when the DAG is built (benchmarks/ scripts write them into
        # results/benchmarks/, shared by every study) join the reports.
        benchmarks=sorted(glob.glob(f"{os.path.dirname(R)}/benchmarks/**/*.parquet", recursive=True)),
    output:
        # Every table (csv) and plot (png) the study supports goes into `snakemake --report`.
        reports=report(
            directory(f"{R}/report"),
            patterns=["{name}.png", "{name}.csv"],
            category="Study reports",
            caption="../report/reports.rst",
        ),
    log:
        f"{R}/logs/report/report.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        results_dir=lambda w, output: os.path.dirname(output.reports),  # results/<experiment>/report -> results/<experiment>
        settings=step_settings("report"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)
