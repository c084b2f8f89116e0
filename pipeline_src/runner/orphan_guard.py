"""Stop a job whose Snakemake process was killed (SIGKILL of that process alone).

A job's client is a thread of the main Snakemake process, whose death closes the job's fork-server
connection and so stops the job (`forkserver.py`). A client in a process of its own, though (a
Snakemake started per job where the workflow profile is not used, `launch.run_job`), outlives a
killed main Snakemake. The main Snakemake process therefore names itself in `PIPELINE_RUN_OWNER`
(`store/atomic.py`, set in `workflow/rules/common.smk`), and a thread of such a client polls that
process. Once it is gone the thread kills the job's child (its whole process group) and the
client itself. The child's own renames refuse meanwhile (`atomic.commit`), so no output appears
after the kill.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

from pipeline_src.store.atomic import run_owner_gone

POLL_S = 0.2  # how late a job of a killed run may notice; a check costs one /proc read


def stop_with_run(child_group: Callable[[], int | None], poll_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that SIGKILLs the job once the Snakemake process that owns its run is gone.

    Args:
        child_group: returns the process group of the job's fork-server child (None: none yet).
        poll_s: seconds between checks.
    Returns:
        The thread (it ends with the process).
    """
    def watch() -> None:
        while not run_owner_gone():
            time.sleep(poll_s)
        group = child_group()
        if group is not None:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="orphan-guard", daemon=True)
    thread.start()
    return thread
