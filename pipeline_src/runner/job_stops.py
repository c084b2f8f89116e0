"""Ctrl-C stops the jobs that run in threads of Snakemake's own process.

Every rule's `run:` block (`launch.run_job`) waits for its job in a thread of the main Snakemake
process (Snakemake runs `run:` blocks in threads under `--force-use-threads`, which the workflow
profile `profiles/default/config.yaml` sets). Ctrl-C sends SIGINT to the run's process group,
but each job runs in a session of its own (a fork-server child, a job process, a GPU worker), so
the signal would not reach it, and Snakemake would wait for its threads, that is for every
running job to end (docs/reliability.md). So the main process's SIGINT handler first stops the
registered jobs, then does what the handler before it did (Python's: `KeyboardInterrupt`, which
Snakemake takes as "Terminating processes on user request").
"""
from __future__ import annotations

import contextlib
import itertools
import signal
import threading
from typing import Callable, Iterator

_lock = threading.Lock()
_stops: dict[int, Callable[[int], None]] = {}  # id -> stop(signum) of a running job
_ids = itertools.count()


@contextlib.contextmanager
def stoppable(stop: Callable[[int], None]) -> Iterator[None]:
    """Register `stop(signum)` as the way to stop the job that runs during the block."""
    key = next(_ids)  # atomic under the GIL
    with _lock:
        _stops[key] = stop
    try:
        yield
    finally:
        with _lock:
            _stops.pop(key, None)


@contextlib.contextmanager
def stopped_by_signals(stop: Callable[[int], None]) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM call `stop(signum)`: in a job's own client process
    (the main thread) through handlers that then exit with 128 + signum, restored after (a handler
    left behind would be inherited by anything the caller forks later); in a thread of Snakemake's
    process through `stoppable` (SIGINT, `forward_interrupts`; Snakemake's own SIGTERM waits for
    its jobs)."""
    if threading.current_thread() is not threading.main_thread():
        with stoppable(stop):
            yield
        return

    def forward(signum, _frame):
        stop(signum)
        raise SystemExit(128 + signum)

    handlers = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def stop_all(signum: int) -> int:
    """Call every registered stop with `signum`; returns how many there were."""
    with _lock:
        stops = list(_stops.values())
    for stop in stops:
        try:
            stop(signum)
        except (ProcessLookupError, OSError):  # ended meanwhile
            pass
    return len(stops)


def forward_interrupts() -> bool:
    """In the main thread: make SIGINT stop the registered jobs before the handler that was there
    runs. Returns False where it cannot (not the main thread), did already, or SIGINT is ignored
    (a background job of a script: Ctrl-C of its terminal is not for it)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN or getattr(previous, "_stops_jobs", False):
        return False

    def handler(signum, frame):
        stop_all(signum)
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL, or a handler installed outside Python
            raise KeyboardInterrupt

    handler._stops_jobs = True
    signal.signal(signal.SIGINT, handler)
    return True
