"""Start a Snakemake run so that it can be stopped now, and stop it (issue 44, docs/reliability.md).

Snakemake 9 (9.27 measured) does not stop its running jobs when only its own process is signalled:
SIGTERM logs "Will exit after finishing currently running jobs" and waits for them; SIGINT logs
"Terminating processes on user request" and waits too; a second SIGINT ends Snakemake with a
traceback but leaves a plain job running. What stops a run at once is SIGINT to its whole process
group, as Ctrl-C in a terminal sends it: Snakemake's handler passes it to every running job's
process first (fork-server child or job process, each in a session of its own; `job_stops.py`), the jobs
end, and Snakemake exits within seconds, removing its lock. Should it still run after a grace
period, SIGKILL of Snakemake is the fallback: the orphan guard (`orphan_guard.py`) ends its jobs
within 0.2 s, and the lock stays (`snakemake --unlock`, docs/reliability.md).

A run is a process group of its own only if it was started in a new session, and SIGINT reaches
it only if it is not ignored: a shell's background job (`cmd &`) starts with SIGINT ignored, and
Python then installs no handler. `start_snakemake` sees to both.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python then raises KeyboardInterrupt on it


def start_snakemake(cmd: list[str], **popen: Any) -> subprocess.Popen:
    """Start a Snakemake command as a process group of its own that `stop_snakemake` can stop.

    Args:
        cmd: the command line.
        popen: further `subprocess.Popen` arguments (stdout, env, cwd, ...).
    """
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_default_sigint, **popen)


def stop_snakemake(proc: subprocess.Popen, grace_s: float = 60.0) -> str:
    """Stop a run started by `start_snakemake` now, its running jobs included (module doc).

    Args:
        proc: the Snakemake process, leader of its own process group.
        grace_s: seconds to wait after SIGINT before the SIGKILL fallback.

    Returns:
        how it ended: "exited" (before any signal), "sigint" (jobs stopped, lock removed) or
        "sigkill" (the orphan guard stops the jobs; the lock stays).
    """
    if proc.poll() is not None:
        return "exited"
    if os.getpgid(proc.pid) != proc.pid:
        raise ValueError(f"snakemake (pid {proc.pid}) is not a process group of its own: start it with "
                         "start_snakemake (or start_new_session=True), or its jobs do not get the SIGINT")
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
        return "sigint"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "sigkill"
