# Validation, paths, and every function the rules use (input, params and signature functions,
# per study below): the rule files hold rules only (`snakemake --lint`).
import json
import os
import sys

sys.path.insert(0, workflow.basedir)  # pipeline_src is importable without installing it
if workflow.is_main_process:  # before the parse: fewer, cheaper collections while the DAG grows
    from pipeline_src.plan.scheduler_gc import tune_collector

    tune_collector()
# Jobs, the fork server and Slurm jobs inherit this: they run this workflow's package, never
# another checkout's that an editable install of one shared virtualenv points at.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [workflow.basedir] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != workflow.basedir]
)

from pipeline_src.plan.private_workspace import close_snakemake_log, owner_only_umask, privacy_requested

if privacy_requested(config):  # a DP study: before the parse logs a line into Snakemake's log (made 0644)
    owner_only_umask()
    close_snakemake_log()


envvars:
    "PYTHONPATH",  # declared, so remote executors (Slurm) pass it on to jobs too


from snakemake.exceptions import IncompleteCheckpointException
from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.methods.kinds import feature_cache, kind_of
from pipeline_src.plan.feature_budget import side_everys
from pipeline_src.plan.job_settings import INIT_RULE, RUN_ONLY, training_signature as training_signature_json
from pipeline_src.plan.environment import warn_on_lock_drift
from pipeline_src.plan.forget import nonlinear_paragon
from pipeline_src.plan.last_grid import grid_points
from pipeline_src.plan.privacy import dp_method_config, dp_settings
from pipeline_src.plan.search import is_variant, method_shards
from pipeline_src.plan.selected_point import PRIVATE_AXES, TRAIN_AXES, chosen_point, selected_at, selection_file
from pipeline_src.plan.step_settings import dataset_signature, settings_for
from pipeline_src.plan.vectorized import train_method_constraint, vectorized_jobs


def run_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env):
    """Every rule's `run:` block: the job's step (`pipeline_src/runner/launch.py`, in a thread of this
    process under the workflow profile profiles/default). Imported here, not at the parse: dry runs skip it."""
    from pipeline_src.runner.launch import run_job as launch_job

    launch_job(rule, input, output, params, wildcards, threads, resources, log, config, conda_env)


if workflow.is_main_process:  # once per run: not again in each Slurm or subprocess job
    from snakemake.logging import logger
    from pipeline_src.plan.run_start import own_run

    warn_on_lock_drift(logger, f"{workflow.basedir}/requirements.lock")
    own_run()  # jobs inherit it: one whose Snakemake was killed stops and writes nothing
    from pipeline_src.plan.scheduler_timers import keep_one_reevaluation_timer

    keep_one_reevaluation_timer()  # Snakemake's own CPU no longer grows with jobs done x run length
    from pipeline_src.plan.params_serializer import pandas_only_when_imported

    pandas_only_when_imported()  # a dry run of a finished study no longer imports pandas (0.3 CPU-s)
    from pipeline_src.plan.producer_memo import remember_producers

    remember_producers()  # the DAG searches each file's producers once, not once per job reading it
    from pipeline_src.plan.function_params_memo import remember_function_params

    remember_function_params()  # each rule function's signature inspected once, not twice per job
    from pipeline_src.runner.job_stops import forward_interrupts

    forward_interrupts()  # Ctrl-C stops the jobs that run in this process's threads

from pipeline_src.plan.studies import old_layout_error, slurm_jobname_prefix, study_results

# Each study writes under results/<experiment>/ (docs/studies.md): running one never touches another's.
_study_root = study_results(config.get("experiment"))  # None: no valid name; validation below says so
_old_layout = old_layout_error("results", config.get("experiment"))
if _old_layout:
    raise WorkflowError(_old_layout)

if workflow.is_main_process and _study_root:
    from pipeline_src.plan.run_start import at_exit, killed_rebuilds

    at_exit(workflow, _study_root)  # temp files of killed writers and the validation cache, even if no job starts
    # Files a killed run had deleted to rebuild them (a --forcerun): inputs of `all`, so rebuilt.
    KILLED_REBUILDS = killed_rebuilds(_study_root)
    if KILLED_REBUILDS:
        logger.info(
            f"{len(KILLED_REBUILDS)} file(s) deleted by a killed run or check_outputs --rebuild are rebuilt,"
            f" e.g. {KILLED_REBUILDS[0]}"
        )
else:
    KILLED_REBUILDS = []

# What validation derives from the data is cached under results/<experiment>/prepare/.plan_cache,
# written only when a run executes (run_start.at_exit): a dry run or --lint (parsed before
# Snakemake says which it is) writes nothing.
from pipeline_src.plan.cache import hold_writes

hold_writes()
try:
    from pipeline_src.plan.config_files import check_duplicate_keys

    check_duplicate_keys(workflow.configfiles)  # Snakemake's loader let the last of two equal keys win
    _validated = validate_config(config, cache_dir=_study_root and f"{_study_root}/prepare/.plan_cache")
except ConfigError as err:
    raise WorkflowError(f"Invalid config: {err}") from None
config.clear()
config.update(_validated)
if workflow.is_main_process:  # the estimated feature cache sizes (refused over features.max_cache_gb above)
    from pipeline_src.plan.config import check_cache_budget

    for _line in check_cache_budget(config):
        logger.info(_line)

R = _study_root  # results/<experiment>, named before validation (which refuses a bad name): every rule builds its paths from R

if config["privacy"]["enabled"]:  # a DP study's workspace is owner-only from now on (plan/private_workspace.py)
    from pipeline_src.plan.private_workspace import owner_only_metadata, tighten

    owner_only_umask()  # again: a privacy the check at the top did not read as enabled
    owner_only_metadata()  # Snakemake chmods its metadata 0660 whatever the umask: 0600 from its first byte

if workflow.is_main_process:
    # What Snakemake tells only when it executes, after this parse: whether this is a dry run, and
    # the executor's settings.
    from pipeline_src.plan.provenance_key import make_key
    from pipeline_src.plan.study_lock import StudyRunning, lock_study, refuse_unlock_while_running

    _execute, _unlock = workflow.execute, workflow.unlock

    def _execute_study(*args, executor_settings=None, **kwargs):
        if not kwargs["executor_plugin"].common_settings.dryrun_exec:  # a dry run writes nothing, modes included
            if workflow.execution_settings.lock:  # one run per study, whatever the other studies do (--nolock: none)
                try:
                    lock_study(config["experiment"])
                except StudyRunning as err:
                    raise WorkflowError(str(err)) from None
            if config["privacy"]["enabled"]:  # once per run, not again in each job's parse
                tighten([R, ".snakemake"])
                # Before the DAG reads any params: its digests of id lists are keyed (member_ids_digest).
                make_key(R)
            # A local run of a study without its report yet (a first run, most likely with jobs):
            # the fork server's imports overlap the DAG's building.
            if kwargs["executor_plugin"].name == "local" and not os.path.isdir(f"{R}/report"):
                from snakemake_interface_executor_plugins.settings import DeploymentMethod
                from pipeline_src.runner.launch import prestart_server

                prestart_server(conda=DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method)
        # Slurm job names carry the study (the plugin's --slurm-jobname-prefix, unless one is given),
        # so two studies on one cluster are told apart.
        if getattr(executor_settings, "jobname_prefix", None) == "":
            executor_settings.jobname_prefix = slurm_jobname_prefix(config["experiment"])
        return _execute(*args, executor_settings=executor_settings, **kwargs)

    def _unlock_study():
        try:
            refuse_unlock_while_running(config["experiment"])
        except StudyRunning as err:
            raise WorkflowError(str(err)) from None
        return _unlock()

    workflow.execute, workflow.unlock = _execute_study, _unlock_study

if config["privacy"]["enabled"]:

    # What Snakemake made before this parse (its log) or beside the patched writer: closed when the run ends.
    onsuccess:
        tighten([".snakemake"])

    onerror:
        tighten([".snakemake"])


onstart:
    # Jobs killed between write and rename leave temporary files: remove those whose writer is
    # gone (plan/run_start.py). Here, holding the run's lock, never in a dry run.
    from pipeline_src.plan.run_start import clear_killed_temps, journal_rebuilds
    from snakemake.logging import logger
    from pipeline_src.plan.cache import write_held

    _cleared = clear_killed_temps(R)
    if _cleared:
        logger.info(_cleared)
    # Outputs about to be deleted and rebuilt: a kill before Snakemake marks them incomplete loses nothing.
    journal_rebuilds(R, [str(f) for job in workflow.dag.needrun_jobs() for f in job.output])
    write_held()  # the validation cache: a run that starts jobs, never a dry run
    if config["privacy"]["enabled"]:  # its non-DP models are private workspace from now on (methods/export.py)
        from pipeline_src.plan.private_workspace import mark_dp_study

        mark_dp_study(R)


STUDY_METRICS = []  # metrics files of the extra studies (fusion, privacy, forget) the report reads
METHODS = list(config["methods"])
VECTORIZED_JOBS = vectorized_jobs(config)  # (method, N, seed, shards) trained in one job each (`plan/vectorized.py`)
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


def rebuilds(wildcards):
    """The journaled files (`KILLED_REBUILDS`) that this study still builds. One that it no longer
    builds (its method taken out of the config) is left out, not demanded by `all`."""
    return [f for f in KILLED_REBUILDS if any(r.is_producer(f) for r in workflow.rules)]


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
