"""Entry point of every rule's `run:` block: run one step with its log captured.

Every rule's `run:` block calls `run_job(rule, input, output, ...)` (`workflow/rules/*.smk`).
Snakemake runs it in a thread of its own process (`--force-use-threads`, set by the workflow
profile `profiles/default/config.yaml`), so a job costs no Python process of its own besides
the step's: a `script:` job's client, a fresh Python that imports Snakemake to unpickle its job,
cost 0.18 CPU-s a job (docs/performance.md). Inside a Slurm job, Snakemake's job step runs it
the same way. The step's stdout and stderr (tqdm progress included) go to the rule's `log:`
file, and `pipeline_src.steps.<step>.main(StepArgs)` runs in a worker of the GPU job server when
it runs a model on a GPU (`pipeline_src/runner/gpu_server.py`: one CUDA context per worker, not
per job), else in a child of the local fork server (`pipeline_src/runner/forkserver.py`, which
saves the seconds of importing torch per job) or, with `PIPELINE_FORKSERVER=0`, inside a Slurm
job, under `--sdm conda` (in the rule's env's Python), or when no server can be started, in a
process of its own (`pipeline_src/runner/job_process.py`). The process that reaps the job
measures its exact peak RSS with `os.wait4` (a GPU worker, reused, its high-water mark during
the job), and `launch` writes it beside the log, `<log stem>.rss.json` (`store/job_rss.py`).

A job that declares the `gpu` resource holds that many device slots for its whole run
(`pipeline_src/runner/gpu_slots.py`) and runs with `CUDA_VISIBLE_DEVICES` set to them in its own
environment, because Snakemake does not place local jobs on devices itself.

Ctrl-C stops the running jobs (`job_stops.py`); a job whose Snakemake process was killed stops at
once: its fork-server connection closes with that process (`forkserver.py`).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pipeline_src.plan.rule_steps import step_of_rule
from pipeline_src.runner.gpu_server import wants_gpu_server
from pipeline_src.runner.gpu_slots import acquire_gpu
from pipeline_src.runner.job_process import JobExit, run_measured
from pipeline_src.runner.orphan_guard import stop_with_run
from pipeline_src.runner.step_args import from_job
from pipeline_src.store.atomic import run_owner_is_me
from pipeline_src.store.job_bench import bench_path, write_job_bench
from pipeline_src.store.job_rss import clear_job_rss, write_job_rss


class StepFailed(Exception):
    """A job's step ended with a non-zero status (its log says why)."""


def run_job(rule: str, input, output, params, wildcards, threads: int, resources, log, config: dict,
            conda_env: str | None = None) -> None:
    """Run the rule's step (`steps.step_of_rule`) for the job of a `run:` block.

    Args:
        rule, input, output, params, wildcards, threads, resources, log: the `run:` block's names.
        config: the workflow's config (run-only settings; the whole config for rules without settings).
        conda_env: the rule's conda env under `--sdm conda` (the step then runs in its Python).
    Raises:
        StepFailed: the step failed; the message names its log's last line.
    """
    step = step_of_rule(rule)
    if not run_owner_is_me() and not os.environ.get("SLURM_JOB_ID"):
        print(f"{rule}: this job's `run:` block runs in a Snakemake process started for it (seconds a job): "
              "run with the workflow profile profiles/default, or --force-use-threads", file=sys.stderr)
    args = from_job(rule, input, output, params, wildcards, threads, resources, log, config)
    python = str(Path(conda_env) / "bin" / "python") if conda_env else None
    code = launch(step, args, python=python)
    if code:
        raise StepFailed(f"{step} failed ({code}): {_last_log_line(args)}")


def uses_fork_server(conda: bool = False) -> bool:
    """Whether this process's local jobs run in the fork server (`launch`): not disabled
    (`PIPELINE_FORKSERVER=0`), not inside a Slurm job, not in a rule's conda env."""
    return os.environ.get("PIPELINE_FORKSERVER", "1") != "0" and not os.environ.get("SLURM_JOB_ID") and not conda


def prestart_server(conda: bool = False) -> bool:
    """Start the fork server in the background at a local run's start (`forkserver.prestart`), if
    its jobs will use it: its imports (about 6 s of one core) then overlap Snakemake's building of the
    DAG instead of delaying the first job. True when one was started."""
    if not uses_fork_server(conda):
        return False
    from pipeline_src.runner.forkserver import prestart

    return prestart()


def _last_log_line(args) -> str:
    tail = Path(args.log[0]).read_text(errors="replace").strip().splitlines()[-1:] if args.log else []
    return f"{' '.join(tail)} (log: {args.log[0] if args.log else '-'})"


def launch(step: str, args, python: str | None = None) -> int:
    """Run the step for `args` where it should run (module doc); returns its exit status.

    Args:
        step: the step module's name.
        args: the job's StepArgs.
        python: run it in this interpreter's own process (a rule's conda env), not in a server.
    """
    t0 = time.monotonic()
    child: list[int] = []  # the job process's pid (= its process group: a fork-server child or its own), once known
    if not run_owner_is_me():  # a job's own client: a killed Snakemake stops this job too
        stop_with_run(lambda: child[-1] if child else None)
    if args.log:  # a former run's figures go: a job that fails shows none
        clear_job_rss(args.log[0])
        bench_path(args.log[0]).unlink(missing_ok=True)
    with acquire_gpu(int(args.resources.get("gpu", 0) or 0), set_environ=False) as held:
        env = dict(os.environ)
        if held:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(held)
        done: JobExit | None = None
        if python is None and wants_gpu_server(step, args.runtime.get("device"), bool(held)):
            from pipeline_src.runner.gpu_server import run_in_gpu_server

            done = run_in_gpu_server(step, args, env=env)  # the client's death or signal stops the job's worker
            how = "VmHWM: gpu-server worker"
        # Not inside a Slurm job: a server started there would outlive the job's allocation.
        if done is None and python is None and uses_fork_server():
            from pipeline_src.runner.forkserver import run_in_server

            done = run_in_server(step, args, child.append, env=env)
            how = "wait4: fork-server child"
        if done is None:
            done = run_measured(step, args, child.append, env=env, python=python)
            how = "wait4: job process"
    if args.log and done.peak_kib is not None:
        write_job_rss(args.log[0], done.peak_kib, how, done.code)
    if args.log and done.code == 0:  # as Snakemake, which writes a failed job's benchmark no row
        write_job_bench(args.log[0], time.monotonic() - t0, done.peak_kib, done.cpu_s)
    return done.code
