"""How a job's CPU threads behave when the machine is shared (issue 44).

Two things decide whether a 2-thread job slows down in proportion to its CPU share or collapses:

- How OpenMP threads wait at the end of each parallel region. torch's pip wheels use GNU OpenMP
  (libgomp), whose idle threads spin 300,000 times before they sleep. When the partner thread is
  descheduled by a busy machine, the spinning thread burns its time slice waiting, region after
  region: a pretrain epoch beside 4 busy processes on 2 cores took 7.5-36x its idle time, where the
  CPU share explains 3x (`benchmarks/bench_contention.py`, docs/performance.md). Jobs now spin
  1,000 times (`GOMP_SPINCOUNT`), then sleep: the order of libgomp's own short spin for a process it
  knows has more threads than CPUs (100 by default, 1,000 under `OMP_WAIT_POLICY=ACTIVE`), which it
  cannot know when the other threads are other processes'. On a 2-core AVX2 AMD EPYC, 10,000 spins
  gave 3.5-7.7x (median 5.3x, 8 runs): in the slow runs the job burnt twice its idle CPU spinning.
  1,000 gave 3.2-4.7x (median 3.8x, 9 runs) with the job's CPU at its idle figure, at +4-18 % on the
  idle epoch; what is left above 3x is the two threads' lockstep, which neither sleeping at once
  (`OMP_WAIT_POLICY=PASSIVE`, +3-68 % idle) nor one thread removes. libgomp reads these when it
  is loaded, so `set_wait_policy` must run before torch is imported: the fork server
  (`forkserver.serve`) and a job's own process (`job_process.main`) call it first. A wait policy or
  spin count the user set wins.
- How many intra-op threads run. A job declares `threads:`; a process limited by its CPU affinity
  (`taskset`, Slurm's binding) or its cgroup's quota (`cpu.max`, containers, Kubernetes limits)
  to fewer CPUs gets no more threads than it has CPUs (`job_threads`).

`benchmarks/bench_contention.py` measures a 2-thread training epoch beside k busy processes.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

# Read by libgomp at load time; see the module doc.
WAIT_POLICY = {"GOMP_SPINCOUNT": "1000"}
USER_WAIT = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # any of these set by the user: theirs, unchanged


def set_wait_policy(environ: dict | None = None) -> dict[str, str]:
    """Set `WAIT_POLICY` in the environment unless the user chose how OpenMP threads wait
    (`USER_WAIT`); call it before torch (and so libgomp) is imported.

    Args:
        environ: the environment to change (default: `os.environ`).

    Returns:
        the variables this call set.
    """
    environ = os.environ if environ is None else environ
    added = {} if any(k in environ for k in USER_WAIT) else dict(WAIT_POLICY)
    environ.update(added)
    return added


def _quota_cpus(quota: str, period: str) -> float | None:
    """CPUs allowed by one cgroup's quota and period (`max` or a negative quota: no limit)."""
    if quota.strip() in ("max", "") or int(quota) < 0:
        return None
    return int(quota) / int(period)


def cgroup_cpu_limit(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPUs (a fraction) this process's cgroup quota allows, or None without a quota.

    cgroup v2: the smallest `cpu.max` ("<quota> <period>" or "max <period>") of the process's cgroup
    and its ancestors up to `root`. cgroup v1: `cpu.cfs_quota_us` / `cpu.cfs_period_us` of its
    `cpu` controller's cgroup (-1: none). Unreadable files count as no limit.

    Args:
        proc_cgroup: the process's cgroup membership (`/proc/<pid>/cgroup`).
        root: where the cgroup file systems are mounted.
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2: every level from the process's cgroup up to the root
            folder = root / rel
            while True:
                try:
                    got = _quota_cpus(*(folder / "cpu.max").read_text().split()[:2])
                except (OSError, ValueError, TypeError):
                    got = None
                if got is not None:
                    limits.append(got)
                if folder == root or root not in folder.parents:
                    break
                folder = folder.parent
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's hierarchy
            base = root / controllers
            base = base if base.is_dir() else root / "cpu"
            try:
                got = _quota_cpus((base / rel / "cpu.cfs_quota_us").read_text(),
                                  (base / rel / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                got = None
            if got is not None:
                limits.append(got)
    return min(limits) if limits else None


def usable_cpus(affinity: set[int] | None = None, quota: float | None = None) -> int:
    """How many CPUs this process may keep busy: its affinity mask's size, capped by the cgroup
    quota rounded up (a quota of 1.5 CPUs still lets two threads run), at least 1.

    Args:
        affinity: the CPUs it may run on (default: `os.sched_getaffinity(0)`).
        quota: CPUs its cgroup allows (default: `cgroup_cpu_limit()`).
    """
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    if quota is None:
        quota = cgroup_cpu_limit()
    cpus = len(affinity)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota - 1e-9))
    return max(1, cpus)


def job_threads(declared: int, cpus: int | None = None) -> int:
    """A job's intra-op threads: its declared `threads`, no more than the CPUs it may use.

    Args:
        declared: the rule's `threads` (Snakemake's value for this job).
        cpus: `usable_cpus()` (default: measured now).
    """
    return max(1, min(int(declared), usable_cpus() if cpus is None else cpus))
