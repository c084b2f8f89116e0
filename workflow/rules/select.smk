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
    wildcard_constraints:
        model="shard|soup|ensemble",
    conda:
        "../envs/pipeline.yaml"
    params:
        model=lambda w: "shards" if w.model == "shard" else w.model,  # a full-data model: one shard
        split="val",
        settings=step_settings("validate"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


# A checkpoint: the jobs at a selected point take its record as input (inputs.smk, `selected_point`).
checkpoint select:
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
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


SELECTIONS = selection_targets(config, R)
STUDY_METRICS.extend(SELECTIONS)


rule search:
    input:
        SELECTIONS,


# The paper's DP search: each taft method of the privacy study at PT = T and F (the other PT is a
# method only the privacy study trains), selected per protocol, regime and ε on validation.
from pipeline_src.plan.private_search import private_selection_targets, private_validation_targets
from pipeline_src.plan.privacy import target_epsilon
from pipeline_src.plan.search import dp_candidates


rule validate_private:
    input:
        unpack(private_evaluation_inputs),
    output:
        metrics=f"{R}/validate_private/{PRIVATE_LOG}/{{dp_model}}.parquet",
    log:
        f"{R}/logs/validate_private/{PRIVATE_LOG}/{{dp_model}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        model=lambda w: "dp-shard" if w.dp_model.startswith("shard") else f"dp-{w.dp_model}",
        shard_id=lambda w: int(w.dp_model.removeprefix("shard")) if w.dp_model.startswith("shard") else None,
        split="val",
        settings=step_settings("validate_private"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


rule select_private:
    input:
        validation=lambda w: private_validation_targets(config, R, w.protocol, w.method, w.regime, w.eps),
    output:
        choice=f"{R}/select_private/{{protocol}}/{{method}}/{{regime}}/eps{{eps}}.parquet",
        record=f"{R}/select_private/{{protocol}}/{{method}}/{{regime}}/eps{{eps}}.json",
    log:
        f"{R}/logs/select_private/{{protocol}}/{{method}}/{{regime}}/eps{{eps}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        candidates=lambda w: dp_candidates(config, w.method),
        labels=lambda w: {"protocol": w.protocol, "regime": w.regime, "epsilon": target_epsilon(config, w.eps)},
        settings=step_settings("select_private"),
    run:
        run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


PRIVATE_SELECTIONS = private_selection_targets(config, R)
SELECTIONS.extend(PRIVATE_SELECTIONS)
STUDY_METRICS.extend(PRIVATE_SELECTIONS)
