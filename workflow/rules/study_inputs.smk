# Input, params and signature functions of the side studies' rules (ablations.smk, forget.smk,
# fusion.smk, last_grid.smk, privacy.smk), built on the core ones (inputs.smk). The rule files
# hold rules only (`snakemake --lint`).
import json

from pipeline_src.methods.kinds import kind_of
from pipeline_src.plan.forget import nonlinear_paragon
from pipeline_src.plan.job_settings import INIT_RULE, RUN_ONLY
from pipeline_src.plan.last_grid import grid_points
from pipeline_src.plan.privacy import dp_method_config, dp_settings


# ------------------------------------------------------------ the ablation study (ablations.smk)
def ablation_inputs(w):
    inputs = {k: v for k, v in train_inputs_of(w.method, 1, w.seed, 0).items()}
    return {**inputs, "signature": signature_path(f"train-{w.method}")}


# ------------------------------------------------------------ the unlearning study (forget.smk)
def _study_cache_input(w, method_cfg=None):
    return feature_inputs(w.method, method_cfg)


def unlearn_drop_inputs(w):
    inputs = {
        "samples": f"{R}/prepare/samples.parquet",
        "backbone": f"{R}/pretrain/model.safetensors",
        "models": shard_models(w),
    }
    if kind_of(config["methods"][w.method]).tangent:
        inputs["composed"] = f"{R}/compose/{w.method}/n{w.shards}_s{w.seed}/soup.safetensors"
    return {**inputs, **selection_input(w.method, w.shards)}


def unlearn_retrain_inputs(w):
    return {
        "samples": f"{R}/prepare/samples.parquet",
        "backbone": f"{R}/pretrain/model.safetensors",
        "models": shard_models(w),
        **_study_cache_input(w),
        **selection_input(w.method, w.shards),
    }


def unlearn_paragon_inputs(w):
    return {
        "samples": f"{R}/prepare/samples.parquet",
        "backbone": f"{R}/pretrain/model.safetensors",
        "full": f"{R}/train/{w.method}/n1_s{w.seed}/shard0.safetensors",
        **_study_cache_input(w),
        **selection_input(w.method, 1),  # the paragon is a full-data model
    }


def unlearn_paragon_nonlinear_inputs(w):
    """As the paragon's, with the features of the non-linear model it trains (TAFT App. C.3)."""
    _, method = nonlinear_paragon(config, w.method)
    return {
        "samples": f"{R}/prepare/samples.parquet",
        "backbone": f"{R}/pretrain/model.safetensors",
        "full": f"{R}/train/{w.method}/n1_s{w.seed}/shard0.safetensors",
        **_study_cache_input(w, method),
    }


def nonlinear_paragon_signature(w):
    name, method = nonlinear_paragon(config, w.method)
    settings = {k: method.get(k, v) for k, v in config["train"].items() if k not in RUN_ONLY}  # as training_signature
    return json.dumps(
        {"paragon": name, "method": method, "train": settings, "head_seed": config["seed"], "init_seeds": INIT_RULE},
        sort_keys=True,
    )


# ------------------------------------------------------------ the fusion study (fusion.smk)
def fusion_common_inputs(w):
    """Samples, backbone and (when cached) the method's frozen-prefix features."""
    return {
        "samples": f"{R}/prepare/samples.parquet",
        "backbone": f"{R}/pretrain/model.safetensors",
        **feature_inputs(w.method),
    }


def fusion_match_inputs(w):
    if w.init == "shared":
        models = shard_models(w)
    else:
        models = [
            f"{R}/fusion_train/{w.method}/n{w.shards}_s{w.seed}/shard{i}.safetensors" for i in range(int(w.shards))
        ]
    return {**fusion_common_inputs(w), "models": models}


# ------------------------------------------------------------ the LAST grid study (last_grid.smk)
def last_grid_inputs(w):
    """What the `train` step reads for shard 0 of the base method (samples, backbone, manifest, features)."""
    return train_inputs_of(w.method, w.shards, w.seed, 0)


def last_grid_signature(w):
    """The base method's training signature and the grid points: changing either reruns the job."""
    return json.dumps({"base": json.loads(signature_of(w.method)), "points": grid_points(config)}, sort_keys=True)


# ------------------------------------------------------------ the privacy study (privacy.smk)
PRIV = config["privacy"]
PRIVATE = f"{R}/private/{{protocol}}/{{method}}/{{regime}}/eps{{eps}}/n{{shards}}_s{{seed}}"
PRIVATE_METRICS = f"{R}/metrics/private/{{protocol}}/{{method}}/{{regime}}/eps{{eps}}/n{{shards}}_s{{seed}}"
PRIVATE_LOG = "{protocol}/{method}/{regime}/eps{eps}/n{shards}_s{seed}"


def private_signature(w):
    return private_signature_of(w.protocol, w.method)


def private_signature_of(protocol, method_name):
    """Canonical JSON of what determines a DP model besides its inputs and wildcards."""
    method = dp_method_config(config["methods"][method_name], protocol, PRIV["jvp_only"])
    dp = dp_settings(config, protocol)
    return json.dumps(
        {"method": method, "dp": dp, "head_seed": config["seed"], "init_seeds": INIT_RULE}, sort_keys=True
    )


def private_shard_models(w):
    base = PRIVATE.format(**dict(w.items()))
    return [f"{base}/shard{i}.safetensors" for i in range(int(w.shards))]


def private_evaluation_inputs(w):
    inputs = {k: v for k, v in train_inputs_of(w.method, w.shards, w.seed).items() if k != "manifest"}
    base = PRIVATE.format(**dict(w.items()))
    if w.dp_model == "soup":
        inputs["models"] = [f"{base}/soup.safetensors"]
    elif w.dp_model == "ensemble":
        inputs["models"] = private_shard_models(w)
    else:
        inputs["models"] = [f"{base}/{w.dp_model}.safetensors"]
    return inputs
