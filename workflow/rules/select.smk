# The TAFT paper's validation search (config `search:`, pipeline_src/plan/search.py): every grid
# point is a method of `methods:` (trained, composed and tested by the ordinary rules); here each
# candidate is evaluated on the validation split, and `select` picks per searched method and N the
# point of the highest mean validation accuracy. Validation rows live under results/validate/, not
# results/metrics/, so no test report reads them, and `select` reads nothing else.
from pipeline_src.plan.search import selection_points, selection_targets, validation_targets


rule validate:
    input:
        unpack(validate_inputs),
    output:
        metrics=f"{R}/validate/{{method}}/n{{shards}}_s{{seed}}/{{model}}.parquet",
    log:
        f"{R}/logs/validate/{{method}}/n{{shards}}_s{{seed}}/{{model}}.log",
    benchmark:
        f"{R}/logs/validate/{{method}}/n{{shards}}_s{{seed}}/{{model}}.bench.tsv"
    wildcard_constraints:
        model="shard|soup|ensemble",
    conda:
        "../envs/pipeline.yaml"
    params:
        model=lambda w: w.model,
        shard_id=lambda w: 0 if w.model == "shard" else None,
        split="val",
        settings=step_settings("validate"),
    script:
        "../scripts/step.py"


rule select:
    input:
        validation=lambda w: validation_targets(config, R, w.method),
    output:
        choice=f"{R}/select/{{method}}.parquet",
        record=f"{R}/select/{{method}}.json",
    log:
        f"{R}/logs/select/{{method}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        candidates=lambda w: selection_points(config)[w.method],
        settings=step_settings("select"),
    script:
        "../scripts/step.py"


SELECTIONS = selection_targets(config, R)
STUDY_METRICS.extend(SELECTIONS)


rule search:
    input:
        SELECTIONS,
