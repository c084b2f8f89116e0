rule report:
    input:
        lambda w: [*evaluation_targets(), rules.pretrain.output.metrics, *STUDY_METRICS],
    output:
        index_md=f"{R}/report/index.md",
        accuracy_md=report(f"{R}/report/accuracy.md", category="Accuracy", caption="../report/accuracy.rst"),
        accuracy_csv=f"{R}/report/accuracy.csv",
        accuracy_png=report(f"{R}/report/accuracy.png", category="Accuracy", caption="../report/accuracy.rst"),
    params:
        results_dir=R,
    log:
        f"{R}/logs/report/report.log",
    script:
        "../scripts/report.py"
