# Validation, paths and input functions shared by all rules.
import json
import sys

sys.path.insert(0, workflow.basedir)  # pipeline_src is importable without installing it

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.methods.kinds import feature_cache

try:
    _validated = validate_config(config, cache_dir="results/prepare/.plan_cache")
except ConfigError as err:
    raise WorkflowError(f"Invalid config: {err}") from None
config.clear()
config.update(_validated)

R = "results"
STUDY_METRICS = []  # metrics files of the extra studies (fusion, privacy, forget) the report reads
METHODS = list(config["methods"])
VECTORIZED_METHODS = [m for m, c in config["methods"].items() if c.get("vectorized_shards")]
SHARDS = config["shards"]
SEEDS = config["seeds"]
RES = config["resources"]


wildcard_constraints:
    method="|".join(METHODS),
    shards=r"\d+",
    seed=r"\d+",
    shard=r"\d+",
    cache=r"last\d+|blocks",


def mem_per_attempt(mb):
    """A `mem_mb` that grows with each retry: the Slurm profile retries a job killed for memory."""
    return lambda wildcards, attempt: mb * attempt


def training_signature(w):
    return signature_of(w.method)


def signature_of(method_name):
    """Canonical JSON of everything that determines a trained model besides its inputs, so
    editing a method's settings reruns exactly its jobs (and reordering keys reruns nothing)."""
    method = config["methods"][method_name]
    settings = {k: method.get(k, v) for k, v in config["train"].items()}
    return json.dumps({"method": method, "train": settings, "head_seed": config["seed"]}, sort_keys=True)


def train_inputs(w):
    return train_inputs_of(w.method, w.shards, w.seed, int(w.shard))


def shard_manifests(shards, seed, shard=None):
    """The shard manifests a training job reads (rule forget_manifest, workflow/rules/forget.smk):
    each shard's ids minus its forgotten ones. A forget request changes only the affected shards'
    manifests, so only their jobs and dependants rerun. One shard's path, or all N for shard=None."""
    base = f"{R}/split/n{shards}_s{seed}"
    if shard is not None:
        return f"{base}/shard{shard}.parquet"
    return [f"{base}/shard{i}.parquet" for i in range(int(shards))]


def feature_inputs(method_name):
    """{"features": the method's frozen-feature cache} when it trains from one, else {}."""
    cache = feature_cache(config["methods"][method_name])
    if config["features"]["cache"] and cache is not None:
        return {"features": f"{R}/features/{cache}/features.safetensors"}
    return {}


def train_inputs_of(method_name, shards, seed, shard=None):
    return {
        "samples": f"{R}/prepare/samples.parquet",
        "backbone": f"{R}/pretrain/model.safetensors",
        "manifest": shard_manifests(shards, seed, shard),
        **feature_inputs(method_name),
    }


def shard_models(w):
    """The N shard model files of one method, shard count and seed."""
    return [f"{R}/train/{w.method}/n{w.shards}_s{w.seed}/shard{i}.safetensors" for i in range(int(w.shards))]


def evaluation_targets():
    """Every metrics file of the study: each shard model, and each composition for N > 1."""
    out = []
    for m in METHODS:
        for n in SHARDS:
            for s in SEEDS:
                base = f"{R}/metrics/evaluate/{m}/n{n}_s{s}"
                out += [f"{base}/shard{i}.parquet" for i in range(n)]
                if n > 1:
                    out += [f"{base}/{c}.parquet" for c in config["compositions"]]
    return out
