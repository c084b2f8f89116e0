# The study's set-up: its validated config, its results folder `R`, the run's hooks (study lock,
# private workspace, killed runs' files) and the wildcard constraints. The rules' input, params and
# signature functions are in inputs.smk and study_inputs.smk: the rule files hold rules only
# (`snakemake --lint`).
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


from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.environment import warn_on_lock_drift
from pipeline_src.plan.vectorized import vectorized_jobs

# Names the rule files read (their includes share this namespace).
from pipeline_src.plan.feature_budget import side_everys
from pipeline_src.plan.selected_point import PRIVATE_AXES, selected_at
from pipeline_src.plan.step_settings import dataset_signature, settings_for
from pipeline_src.plan.vectorized import train_method_constraint


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
