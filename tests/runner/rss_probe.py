"""Probe jobs for the peak-RSS tests (`test_job_rss.py`): run by a job process or a fork-server child
as `call(step, args)`, with `step` saying what to allocate."""
from __future__ import annotations

import atexit
import os
import signal
import sys
import types

import numpy as np

_HELD: list = []


def touch(mb: int) -> np.ndarray:
    """`mb` MiB, every page written (so resident)."""
    a = np.empty(mb << 20, np.uint8)
    a[::4096] = 1
    return a


def allocate(step: str, args) -> int:
    """`step` = "<MiB now>,<MiB at exit>": hold the first until exit, allocate the second in an atexit handler."""
    now, at_exit = (int(x) for x in step.split(","))
    if now:
        _HELD.append(touch(now))
    if at_exit:
        atexit.register(lambda: _HELD.append(touch(at_exit)))
    return 0


def execute_allocating(step: str, args) -> int:
    """Run `execute` (the job's real path: log, its own peak line) on a step that allocates as `allocate`."""
    from pipeline_src.runner.execute import execute
    from pipeline_src.store import job_counters

    job_counters.write_counters = lambda *a: None  # they import torch (seconds); tested in tests/store/test_job_counters.py

    mod = types.ModuleType("pipeline_src.steps._rss_probe")
    mod.main = lambda a: allocate(step, a)
    sys.modules[mod.__name__] = mod
    return execute("_rss_probe", args)


def die(step: str, args) -> int:
    """Killed by SIGKILL, as by the kernel's OOM killer: no exit status of its own."""
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


def sleep(step: str, args) -> int:
    """Sleeps `step` seconds: a job that runs until it is stopped."""
    import time

    time.sleep(float(step))
    return 0
