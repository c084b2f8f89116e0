# Validation, paths and input functions shared by all rules.
import json
import os
import sys

sys.path.insert(0, workflow.basedir)  # pipeline_src is importable without installing it
# Jobs, the fork server and Slurm jobs inherit this: they run this workflow's package, never
# another checkout's that an editable install of one shared virtualenv points at.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [workflow.basedir] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != workflow.basedir])

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.methods.kinds import feature_cache
from pipeline_src.plan.feature_budget import side_everys
from pipeline_src.plan.job_settings import training_signature as training_signature_json
from pipeline_src.plan.environment import warn_on_lock_drift

if workflow.is_main_process:  # once per run: not again in each Slurm or subprocess job
    from snakemake.logging import logger
    from pipeline_src.plan.run_start import own_run
    warn_on_lock_drift(logger, f"{workflow.basedir}/requirements.lock")
    own_run()  # jobs inherit it: one whose Snakemake was killed stops and writes nothing

try:
    _validated = validate_config(config, cache_dir="results/prepare/.plan_cache")
except ConfigError as err:
    raise WorkflowError(f"Invalid config: {err}") from None
config.clear()
config.update(_validated)
if workflow.is_main_process:  # the estimated feature cache sizes (refused over features.max_cache_gb above)
    from pipeline_src.plan.config import check_cache_budget
    for _line in check_cache_budget(config):
        logger.info(_line)

R = "results"


onstart:
    # Jobs killed between write and rename leave temporary files: remove those whose writer is
    # gone (plan/run_start.py). Here, holding the run's lock, never in a dry run.
    from pipeline_src.plan.run_start import clear_killed_temps
    from snakemake.logging import logger

    _cleared = clear_killed_temps(R)
    if _cleared:
        logger.info(_cleared)

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
    name=r"upstream|(train|private)-[^/]+",


def mem_per_attempt(mb):
    """A `mem_mb` that grows with each retry: the Slurm profile retries a job killed for memory."""
    return lambda wildcards, attempt: mb * attempt


def training_signature(w):
    return signature_of(w.method)


def signature_of(method_name):
    """The signature of a method's training jobs (`plan/job_settings.py`)."""
    return training_signature_json(config, config["methods"][method_name])


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


def feature_inputs(method_name, method_cfg=None):
    """{"features": the method's frozen-feature cache} when it trains from one, else {}
    (`method_cfg`: settings that stand in for the method's, e.g. the non-linear paragon's)."""
    cache = feature_cache(method_cfg or config["methods"][method_name])
    if config["features"]["cache"] and cache is not None:
        return {"features": f"{R}/features/{cache}/features.npy"}
    return {}


def train_inputs_of(method_name, shards, seed, shard=None):
    return {
        "samples": f"{R}/prepare/samples.parquet",
        "backbone": f"{R}/pretrain/model.safetensors",
        "manifest": shard_manifests(shards, seed, shard),
        **feature_inputs(method_name),
    }


def shard_job_inputs(w, signature):
    """A shard job's inputs: its own manifest, and the signature files of its settings and of the
    shared upstream (rule `signature`), by timestamp; the shared upstream files (samples,
    backbone, features) as `ancient`, so a rerun of `prepare` or `features` for new data does not
    rerun shards whose members did not change (the shard manifest job has no inputs: forget.smk)."""
    inputs = {k: v if k == "manifest" else ancient(v) for k, v in train_inputs(w).items()}
    return {**inputs, "signature": signature_path(signature), "upstream": signature_path("upstream")}


def signature_path(name):
    return f"{R}/signatures/{name}.json"


def signature_value(name):
    """The parse-time signature behind `signature_path(name)`: `upstream`, `train-<method>` or
    `private-<protocol>-<method>`."""
    if name == "upstream":
        return upstream_signature()
    job, method = name.split("-", 1)
    if job == "train":
        return signature_of(method)
    protocol, method = method.split("-", 1)  # private-<protocol>-<method>
    return private_signature_of(protocol, method)


def upstream_signature():
    """Canonical JSON of what the shared upstream files hold for a shard job besides its own
    members: dataset settings, backbone (and its pretraining data), features, data seed."""
    from pipeline_src.plan.sharding import membership_digest
    from pipeline_src.plan.forget import samples_table

    t = samples_table(config).to_pydict()
    source_ids = [i for i, task in zip(t["sample_id"], t["task"]) if task == "source"]
    return json.dumps({"dataset": config["dataset"], "backbone": config["backbone"], "features": config["features"],
                       "seed": config["seed"], "pretrain_data": membership_digest(source_ids)}, sort_keys=True)


def dataset_listing_digest():
    """Digest of every listed sample id: `prepare` reruns when files are added or removed."""
    from pipeline_src.plan.sharding import membership_digest
    from pipeline_src.plan.forget import samples_table

    return membership_digest(samples_table(config).column("sample_id").to_pylist())


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
