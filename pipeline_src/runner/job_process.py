"""Run a job in its own process and reap it with `os.wait4`: its exit status and exact peak RSS.

Without the fork server (`PIPELINE_FORKSERVER=0`, inside a Slurm job, or when no server can be
reached) a job's client (`launch.py`) starts `python -m pipeline_src.runner.job_process`, hands it
the job over a pipe and waits for it with `os.wait4`. The kernel's `ru_maxrss` of the reaped
process is its peak to the very end, the interpreter's shutdown included (atexit handlers, module
teardown), which the job's own `[launch] peak RSS` line cannot see (`store/job_rss.py`).

The job process gets the job's environment (a GPU assigned through `CUDA_VISIBLE_DEVICES` holds),
the client's working directory and import path, and its own session (process group), like a
fork-server child: Ctrl-C is passed on (`job_stops.py`), and the process dies with its client
(`PR_SET_PDEATHSIG`: the client thread, which waits for it to the end) if Snakemake is SIGKILLed.

Note: `ru_maxrss` of an exec'd child starts at its parent's RSS at the exec (the kernel keeps the
old address space's high-water mark), so the figure is at least the client's RSS: Snakemake's
process, 150-190 MB in the default study, below a job's torch import.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline_src.runner.cpu_threads import set_wait_policy
from pipeline_src.runner.job_stops import stopped_by_signals

PACKAGE = Path(__file__).resolve().parent.parent  # pipeline_src (this file: pipeline_src/runner/job_process.py)
EXECUTE = "pipeline_src.runner.execute:execute"  # what a job process runs: `execute(step, args)`
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class JobExit:
    """How a job process ended: its exit status (128 + n when killed by signal n), its peak RSS
    in KiB (`ru_maxrss` from `os.wait4`) and its CPU seconds, user + system (None where either
    could not be measured)."""

    code: int
    peak_kib: int | None
    cpu_s: float | None = None


def exit_code(status: int) -> int:
    """A wait status as a shell would show it: the exit code, or 128 + the signal that killed it."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def fork_in_own_group() -> int:
    """`os.fork()` with the child in a process group of its own (its pid) from the fork on.

    Both sides set the group: a child that set it itself could not yet have been scheduled when
    its parent kills the group (`os.killpg` then misses it, and the parent's `reap` waits for its
    whole job: a killed run's last job ran on).
    Returns:
        0 in the child, the child's pid in the parent.
    """
    pid = os.fork()
    try:
        os.setpgid(0, 0) if pid == 0 else os.setpgid(pid, pid)
    except (PermissionError, ProcessLookupError):  # the parent's call after the child exited
        pass
    return pid


def kill_group(pid: int) -> None:
    """SIGKILL the process group of `pid` (a child of `fork_in_own_group`), if any is left."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def reap(pid: int, block: bool = True) -> JobExit | None:
    """Wait for the child `pid` with `os.wait4`; None if it still runs (block=False).

    Args:
        pid: a child of this process.
        block: wait until it exits.
    """
    from pipeline_src.store.job_rss import maxrss_kib

    got, status, usage = os.wait4(pid, 0 if block else os.WNOHANG)
    if got == 0:
        return None
    return JobExit(exit_code(status), maxrss_kib(usage.ru_maxrss), usage.ru_utime + usage.ru_stime)


def resolve(call: str) -> Callable[..., Any]:
    """The function named `module:function`."""
    module, _, name = call.partition(":")
    return getattr(importlib.import_module(module), name)


def run_measured(step: str, args: Any, on_child: Callable[[int], None] | None = None, *,
                 call: str = EXECUTE, env: dict[str, str] | None = None, python: str | None = None) -> JobExit:
    """Run `call(step, args)` in a new Python process of its own and reap it with `os.wait4`.

    Args:
        step: the step module's name.
        args: the job's StepArgs (picklable).
        on_child: called with the process's pid (its process group) once it runs.
        call: `module:function` to run (a test's probe; jobs run `EXECUTE`).
        env: the process's environment (default: this process's).
        python: the interpreter (default: this one's; a rule's conda env gives its own).
    """
    request = pickle.dumps({"call": call, "step": step, "args": args, "cwd": os.getcwd(), "sys_path": sys.path,
                            "parent": os.getpid()})
    # cwd: `-m` puts it first on the path, so the process imports this very package (as the fork server does)
    proc = subprocess.Popen([python or sys.executable, "-m", "pipeline_src.runner.job_process"], cwd=PACKAGE.parent,
                            stdin=subprocess.PIPE, start_new_session=True, env=env)
    if on_child is not None:
        on_child(proc.pid)
    with stopped_by_signals(lambda signum: os.killpg(proc.pid, signum)):  # Snakemake cancelling the job stops it too
        try:
            proc.stdin.write(request)
            proc.stdin.close()
        except BrokenPipeError:  # it died before reading: its status tells
            pass
        done = reap(proc.pid)
        proc.returncode = done.code  # reaped here: Popen must not wait for it again
        return done


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent (the job's client thread) dies; exit if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the orphan guard alone stops the job
        return
    if os.getppid() != parent:
        os._exit(1)


def main() -> None:
    """The job process: read the request from stdin, run it, exit normally (shutdown is measured too)."""
    set_wait_policy()  # before the job imports torch, whose libgomp reads it once (cpu_threads.py)
    request = pickle.loads(sys.stdin.buffer.read())
    _die_with_parent(request["parent"])
    null = os.open(os.devnull, os.O_RDONLY)  # the job's stdin, as a plain script's under Snakemake
    os.dup2(null, 0)
    os.close(null)
    os.chdir(request["cwd"])
    # The job's import path first, in its order (as in a fork-server child).
    sys.path[:] = request["sys_path"] + [p for p in sys.path if p not in request["sys_path"]]
    code = 1
    try:
        code = int(resolve(request["call"])(request["step"], request["args"]) or 0)
    except BaseException:  # report anything, including SystemExit from a step
        traceback.print_exc()
    sys.exit(code)  # not os._exit: atexit handlers and the interpreter's teardown run, inside the measured peak


if __name__ == "__main__":
    main()
