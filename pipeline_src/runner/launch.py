"""Entry point of the Snakemake `script:` file: run one step with its log captured.

Every rule's script, `workflow/scripts/step.py`, calls `run_step(<step>, snakemake)`. The step's
stdout and stderr (tqdm progress included) go to the rule's `log:` file, and
`pipeline_src.steps.<step>.main(StepArgs)` runs in a worker of the GPU job server when it runs a
model on a GPU (`pipeline_src/runner/gpu_server.py`: one CUDA context per worker, not per job), else
in a child of the local fork server
(`pipeline_src/runner/forkserver.py`, which saves the seconds of importing torch per job) or, with
`PIPELINE_FORKSERVER=0`, inside a Slurm job, or when no server can be started, in a process of its
own (`pipeline_src/runner/job_process.py`). The process that reaps the job measures its exact peak
RSS with `os.wait4` (a GPU worker, reused, its high-water mark during the job), and this client
writes it beside the log, `<log stem>.rss.json` (`store/job_rss.py`).

A job that declares the `gpu` resource holds that many device slots for its whole run
(`pipeline_src/runner/gpu_slots.py`) and runs with `CUDA_VISIBLE_DEVICES` set to them, because
Snakemake does not place local jobs on devices itself.

A job whose Snakemake process was killed stops within 0.2 s (`orphan_guard.py`).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline_src.runner.gpu_server import wants_gpu_server
from pipeline_src.runner.gpu_slots import acquire_gpu
from pipeline_src.runner.job_process import JobExit, run_measured
from pipeline_src.runner.orphan_guard import stop_with_run
from pipeline_src.runner.step_args import from_snakemake
from pipeline_src.store.job_rss import clear_job_rss, write_job_rss


def _check_own_code(scriptdir: str | None) -> None:
    """Refuse to run another checkout's package than the workflow's that scheduled the job
    (`workflow/rules/common.smk` puts the workflow first on PYTHONPATH, so this is a guard)."""
    if not scriptdir or not Path(scriptdir).is_dir():  # e.g. a remote workflow's URL
        return
    workflow_pkg = Path(scriptdir).resolve().parent.parent / "pipeline_src"  # <root>/workflow/scripts
    here = Path(__file__).resolve().parent.parent  # pipeline_src (this file: pipeline_src/runner/launch.py)
    if workflow_pkg.is_dir() and workflow_pkg != here:
        raise SystemExit(f"job of the workflow in {workflow_pkg.parent} imported pipeline_src from {here}; "
                         f"put {workflow_pkg.parent} first on PYTHONPATH")


def run_step(step: str, smk) -> None:
    """Run `pipeline_src.steps.<step>.main` for the job described by Snakemake's object."""
    _check_own_code(getattr(smk, "scriptdir", None))
    args = from_snakemake(smk)
    child: list[int] = []  # the job process's pid (= its process group: a fork-server child or its own), once known
    stop_with_run(lambda: child[-1] if child else None)  # a killed Snakemake stops this job too
    if args.log:
        clear_job_rss(args.log[0])
    with acquire_gpu(int(args.resources.get("gpu", 0) or 0)) as held:  # sets CUDA_VISIBLE_DEVICES for the job
        done: JobExit | None = None
        if wants_gpu_server(step, args.runtime.get("device"), bool(held)):
            from pipeline_src.runner.gpu_server import run_in_gpu_server

            done = run_in_gpu_server(step, args)  # the client's death or signal stops the job's worker
            how = "VmHWM: gpu-server worker"
        # Not inside a Slurm job: a server started there would outlive the job's allocation.
        if done is None and os.environ.get("PIPELINE_FORKSERVER", "1") != "0" and not os.environ.get("SLURM_JOB_ID"):
            from pipeline_src.runner.forkserver import run_in_server

            done = run_in_server(step, args, child.append)  # the child takes this process's environment
            how = "wait4: fork-server child"
        if done is None:
            done = run_measured(step, args, child.append)
            how = "wait4: job process"
    if args.log and done.peak_kib is not None:
        write_job_rss(args.log[0], done.peak_kib, how, done.code)
    code = done.code
    if code:
        # Show the reason on the console too, not only in the log.
        tail = Path(args.log[0]).read_text().strip().splitlines()[-1:] if args.log else []
        print(f"{step} failed: {' '.join(tail)} (log: {args.log[0] if args.log else '-'})", file=sys.stderr)
        raise SystemExit(code)
