"""Opt-in cProfile of a job's step: `PIPELINE_PROFILE_DIR=<folder> snakemake ...`.

Each job's step (its module's import and `main`) runs under `cProfile` with a CPU-time clock
(`time.process_time`: all of the process's threads; a shared machine's waits do not count) and
dumps `<folder>/<rule>/<log stem>.prof` when it ends. The folder is made absolute at the job's
start, so jobs in different working folders of one study write to the same place. Off (nothing
imported, nothing timed) when the variable is unset. `docs/performance.md` shows how to read them.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

PROFILE_DIR_ENV = "PIPELINE_PROFILE_DIR"


def profile_path(folder: str | Path, rule: str, log: str | None) -> Path:
    """Where a job's profile goes: `<folder>/<rule>/<log stem>.prof`, the log's folders below the
    rule's in the name (a study's logs are `logs/<rule>/<wildcards...>/<name>.log`).

    Args:
        folder: the profiles' folder (`PIPELINE_PROFILE_DIR`).
        rule: the job's rule (its step where the rule is unknown).
        log: the job's log path, or None (the profile is then `<rule>/job-<pid>.prof`).
    """
    if not log:
        return Path(folder) / rule / f"job-{os.getpid()}.prof"
    parts = Path(log).with_suffix("").parts
    folders = parts[:-1]  # the rule's folder, not a log named like the rule (logs/report/report.log)
    below = parts[len(folders) - folders[::-1].index(rule):] if rule in folders else parts[-1:]
    return Path(folder) / rule / ("__".join(below) + ".prof")


@contextlib.contextmanager
def profiled(rule: str, log: str | None) -> Iterator[None]:
    """Profile the block if `PIPELINE_PROFILE_DIR` is set (else do nothing).

    Args:
        rule: the job's rule, the profile's subfolder.
        log: the job's log path, which names the profile (`profile_path`).
    """
    folder = os.environ.get(PROFILE_DIR_ENV)
    if not folder:
        yield
        return
    import cProfile
    import time

    target = profile_path(Path(folder).resolve(), rule, log)
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        target.parent.mkdir(parents=True, exist_ok=True)
        profile.dump_stats(str(target))
