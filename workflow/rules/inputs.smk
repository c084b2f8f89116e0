# Input, params and signature functions of the core steps' rules (train, select, compose,
# evaluate: train.smk, select.smk, compose.smk, evaluate.smk). Included after common.smk, whose
# validated config and study root `R` they read; the rule files hold rules only (`snakemake --lint`).
import json
import os

from snakemake.exceptions import IncompleteCheckpointException
from pipeline_src.methods.kinds import feature_cache
from pipeline_src.plan.job_settings import training_signature as training_signature_json
from pipeline_src.plan.search import is_variant, method_shards
from pipeline_src.plan.selected_point import TRAIN_AXES, chosen_point, selected_at, selection_file
from pipeline_src.plan.step_settings import dataset_signature, settings_for


def step_settings(rule):
    """A rule's `settings` param: what its jobs read of the config (`plan/step_settings.py`),
    so Snakemake's params trigger reruns a job exactly when one of them changes."""
    return lambda wildcards: settings_for(rule, config, wildcards)


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


def selection_record(spec):
    """The `select` record a job at `spec` reads, and whether it exists. An existing record goes
    through the checkpoint: while `select` is to run again, Snakemake defers the job until it has,
    then builds it again. A missing one (a fresh study) is a plain input, so a dry run lists every
    job; the checkpoint builds its readers again all the same once `select` has run."""
    path = selection_file(R, spec["base"])
    if not os.path.exists(path):
        return path, False
    return checkpoints.select.get(method=spec["base"]).output.record, True


def selected_point(name, shards, axes=TRAIN_AXES):
    """A job's `selected_at` param (`plan/selected_point.py`): which choice of its method's search it
    trains at (N: the models' own, a full-data model's 1) and the point that choice holds now (None
    before `select` has run), or None where it trains at its own settings. The point is the rerun
    trigger: `select` is a checkpoint, so a rerun that changes a choice reruns the jobs at that
    choice, and one that keeps it reruns none (a forget request retrains the touched shards only).

    While `select` is to run (again) in this run, the point is None: the job waits on the checkpoint
    and is built again, its point read anew, once `select` has run. A param cannot wait on the
    checkpoint itself: Snakemake evaluates params lazily, after the input, and a `select` rerunning
    in between (its record deleted, then written) leaves an input that names the record plainly;
    Snakemake refuses a param that waits on a checkpoint its input does not name."""
    spec = selected_at(config, name, int(shards), axes)
    if spec is None:
        return None
    try:
        path, exists = selection_record(spec)
    except IncompleteCheckpointException:
        return {**spec, "point": None}
    return {**spec, "point": chosen_point(path, spec) if exists else None}


def selection_input(name, shards, axes=TRAIN_AXES):
    """{"selection": the `select` record} for a job with a `selected_at`, else {}; once it exists
    `ancient`, since the point in `selected_at`, not the record's time, says whether the job reruns."""
    spec = selected_at(config, name, int(shards), axes)
    if spec is None:
        return {}
    path, exists = selection_record(spec)
    return {"selection": ancient(path) if exists else path}


def fusion_train_inputs(w):
    return {**train_inputs(w), **selection_input(w.method, w.shards)}


def shard_manifests(shards, seed, shard=None):
    """The shard manifests a training job reads (written by `forget_manifest` in forget.smk):
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


def shard_job_inputs(w, signature, axes=TRAIN_AXES):
    """A shard job's inputs: its own manifest, and the signature files of its settings and of the
    shared upstream (rule `signature`), by timestamp; the shared upstream files (samples,
    backbone, features) as `ancient`, so a rerun of `prepare` or `features` for new data does not
    rerun shards whose members did not change (the shard manifest job has no inputs: forget.smk);
    a searched method's `select` record (`selection_input`, the grid `axes` it takes)."""
    inputs = {k: v if k == "manifest" else ancient(v) for k, v in train_inputs(w).items()}
    return {
        **inputs,
        "signature": signature_path(signature),
        "upstream": signature_path("upstream"),
        **selection_input(w.method, w.shards, axes),
    }


def vectorized_job_inputs(method_name, shards, seed, trained):
    """A vectorized training job's inputs: as a shard job's (`shard_job_inputs`), with all N
    manifests in shard order, those of shards it does not train (touched by a forget request) as
    `ancient`: a request then changes neither its inputs nor their times, and the shards it
    trained do not rerun (`plan/vectorized.py`)."""
    inputs = {k: ancient(v) for k, v in train_inputs_of(method_name, shards, seed).items() if k != "manifest"}
    manifests = [m if i in trained else ancient(m) for i, m in enumerate(shard_manifests(shards, seed))]
    return {
        **inputs,
        "manifest": manifests,
        "signature": signature_path(f"train-{method_name}"),
        "upstream": signature_path("upstream"),
        **selection_input(method_name, shards),
    }


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
    from pipeline_src.plan.forget import samples_table

    t = samples_table(config).to_pydict()
    source_ids = [i for i, task in zip(t["sample_id"], t["task"]) if task == "source"]
    return json.dumps(
        {
            "dataset": dataset_signature(config),
            "backbone": config["backbone"],
            "features": config["features"],
            "seed": config["seed"],
            "pretrain_data": member_ids_digest(source_ids),
        },
        sort_keys=True,
    )


def dataset_listing_digest(wildcards):
    """Digest of every listed sample id: `prepare` reruns when files are added or removed. A
    params function, read when the DAG is built (after a real run made the key), not at parse."""
    from pipeline_src.plan.forget import samples_table

    return member_ids_digest(samples_table(config).column("sample_id").to_pylist())


def member_ids_digest(ids):
    """A rerun trigger built from an id list (`plan/provenance_key.ids_digest`): keyed with the
    study's provenance key in a DP study (or a former one), so no unkeyed digest of member ids is
    in its workspace (signatures, `.snakemake/metadata`)."""
    from pipeline_src.plan.provenance_key import ids_digest

    return ids_digest(ids, R, config["privacy"]["enabled"])


def shard_models(w):
    """The N shard model files of one method, shard count and seed."""
    return [f"{R}/train/{w.method}/n{w.shards}_s{w.seed}/shard{i}.safetensors" for i in range(int(w.shards))]


def evaluates_ensemble(shards):
    """Whether the `evaluate_shards` job of N shards also writes their ensemble's rows."""
    return int(shards) > 1 and "ensemble" in config["compositions"]


def evaluation_targets():
    """Every metrics file of the study: the shard models (and their ensemble) of each method, N
    and seed in one file, and the soup's for N > 1."""
    out = []
    for m in METHODS:
        if is_variant(config, m):  # a search's grid point: validated only (select.smk), its method tested
            continue
        for n in method_shards(config, m):  # its own `shards`
            for s in SEEDS:
                base = f"{R}/metrics/evaluate/{m}/n{n}_s{s}"
                out.append(f"{base}/shards.parquet")
                if n > 1 and "soup" in config["compositions"]:
                    out.append(f"{base}/soup.parquet")
    return out


# ------------------------------------------------------------ the validation search (select.smk)
def validate_inputs(w):
    """A candidate's model on the validation split: the full-data model (N = 1), the soup, or the
    shard models of the ensemble."""
    base = {"samples": f"{R}/prepare/samples.parquet", "backbone": f"{R}/pretrain/model.safetensors"}
    if w.model == "shard":
        return {**base, "models": [f"{R}/train/{w.method}/n{w.shards}_s{w.seed}/shard0.safetensors"]}
    if w.model == "soup":
        return {**base, "models": [f"{R}/compose/{w.method}/n{w.shards}_s{w.seed}/soup.safetensors"]}
    return {**base, "models": shard_models(w)}
