# The ablation study (studies.ablations; TAFT Fig. 2 and Table 12): one job per variant of a taft
# method and seed trains it on the whole training split and evaluates it on test. Off by default.
from pipeline_src.plan.ablations import ablation_method, ablation_points

ABL = config["studies"]["ablations"]
ABLATION_POINTS = ablation_points(config) if ABL["enabled"] else {}


def ablation_inputs(w):
    inputs = {k: v for k, v in train_inputs_of(w.method, 1, w.seed, 0).items()}
    return {**inputs, "signature": signature_path(f"train-{w.method}")}


def ablation_targets():
    if not ABL["enabled"]:
        return []
    m = ablation_method(config)
    return [f"{R}/metrics/ablation/{m}/{label}/s{s}.parquet" for label in ABLATION_POINTS for s in SEEDS]


STUDY_METRICS.extend(ablation_targets())


rule ablations:
    input:
        ablation_targets(),


rule ablation:
    input:
        unpack(ablation_inputs),
    output:
        metrics=f"{R}/metrics/ablation/{{method}}/{{variant}}/s{{seed}}.parquet",
    params:
        overrides=lambda w: ABLATION_POINTS[w.variant]["overrides"],
    wildcard_constraints:
        variant="|".join(ABLATION_POINTS) or "none",
    log:
        f"{R}/logs/ablation/{{method}}/{{variant}}/s{{seed}}.log",
    benchmark:
        f"{R}/logs/ablation/{{method}}/{{variant}}/s{{seed}}.bench.tsv"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    script:
        "../scripts/step.py"
