"""Run one step in this process with its stdout and stderr sent to the job's log.

Both ways a job runs call this: `launch.run_step` in the job's own process, and a child of the
fork server (`forkserver.py`). Its own module, so that neither of those imports the other.
"""
from __future__ import annotations

import importlib
import os
import resource
import sys
import time
import traceback
from pathlib import Path

from pipeline_src.job.glibc_malloc import set_mmap_threshold
from pipeline_src.job.profile import profiled
from pipeline_src.runner.step_args import StepArgs

# Tensors of 4 MiB and more are their own mappings, freed back to the OS (`job/glibc_malloc.py`):
# a LAST shard job at 2,000 images peaked at 1.29 GB instead of 1.8-2.0 GB, a TAFT job at +3 % wall.
# (128 KiB, the pin of the memory benchmarks, cost TAFT +10 %.) MALLOC_MMAP_THRESHOLD_ set by the user wins.
JOB_MMAP_THRESHOLD = 4 << 20


def job_allocator(threshold: int = JOB_MMAP_THRESHOLD) -> None:
    """Pin glibc's mmap threshold at `threshold` (a step module's `MMAP_THRESHOLD`, else
    JOB_MMAP_THRESHOLD), unless the user set MALLOC_MMAP_THRESHOLD_."""
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        set_mmap_threshold(threshold)


def execute(step: str, args: StepArgs) -> int:
    """Run the step with stdout/stderr sent to its log; return the exit status."""
    if args.log:
        Path(args.log[0]).parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(args.log[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(log_fd, 1), os.dup2(log_fd, 2)
        os.close(log_fd)
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        print(f"[launch] CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}", flush=True)
    from pipeline_src.store import job_counters  # here: the launcher (in Snakemake's process) needs no torch

    job_counters.reset()
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        job_allocator()  # before the import: torch's own allocations follow it too
        with profiled(args.rule or step, args.log[0] if args.log else None):  # PIPELINE_PROFILE_DIR only
            module = importlib.import_module(f"pipeline_src.steps.{step}")
            if getattr(module, "MMAP_THRESHOLD", JOB_MMAP_THRESHOLD) != JOB_MMAP_THRESHOLD:
                job_allocator(module.MMAP_THRESHOLD)
            module.main(args)
        wall = time.perf_counter() - t0
        if args.log:  # images and model FLOPs, for the report's efficiency table
            job_counters.write_counters(args.log[0], args.rule or step, wall)
        # The exact peak (Snakemake's benchmark files sample it and can miss short peaks);
        # benchmarks/bench_scale.py reads this line. The CPU seconds (all threads) tell a busy
        # machine's wall time from the work itself. Not after a failure: the error stays last.
        print(f"[launch] peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB, "
              f"wall {wall:.2f} s, cpu {time.process_time() - cpu0:.2f} s", flush=True)
        return 0
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()
