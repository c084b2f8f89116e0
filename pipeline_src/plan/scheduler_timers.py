"""At most one pending re-evaluation timer in Snakemake's job scheduler, instead of one more
chain of them for every job that starts or ends.

Snakemake 9's `JobScheduler.schedule` ends every scheduling pass by starting a
`threading.Timer(timespan)` that wakes the scheduler again (its job rate limiter,
`--max-jobs-per-timespan`, default 100/1s). That includes the passes a timer itself woke, so
every pass woken by a job's start or end begins a chain that wakes the scheduler every second
until the run ends. After k such passes the scheduler runs k passes a second, and each one
re-selects among the ready jobs and stats their inputs. Its CPU therefore grows with the jobs
done times the run's length. Measured (cProfile of `snakemake --cores 2`, the default study,
315 jobs in 277 s): 25,151 timer passes; with this patch 517, and the run 257 -> 225 s wall
(docs/performance.md).

Keeping one timer pending keeps the limiter's promise (the scheduler looks again within
`timespan` of any pass) without the chains; a pass that needs an earlier wake-up than the
pending timer's still gets its own. The timer is a daemon thread, so it never holds up
the exit either.
"""
from __future__ import annotations

import threading
import time

_PATCHED = "_pipeline_one_timer"


def keep_one_reevaluation_timer() -> bool:
    """Patch `JobScheduler._schedule_reevalutation` (sic, Snakemake's name) so a scheduler has at
    most one re-evaluation timer pending. Returns whether it patched: False where this Snakemake
    has no such method (another version: left alone) or it is patched already."""
    try:
        from snakemake.scheduling.job_scheduler import JobScheduler
    except ImportError:
        return False
    original = getattr(JobScheduler, "_schedule_reevalutation", None)
    if original is None or getattr(original, _PATCHED, False):
        return False
    lock = threading.Lock()

    def schedule_reevaluation(self, delay: float) -> None:
        due = time.monotonic() + delay
        with lock:
            pending = getattr(self, "_pipeline_timer_due", None)
            if pending is not None and pending <= due:
                return  # the pending timer wakes the scheduler by then anyway
            self._pipeline_timer_due = due

        def wake() -> None:
            with lock:
                if self._pipeline_timer_due == due:
                    self._pipeline_timer_due = None
            self._open_jobs.release()

        timer = threading.Timer(delay, wake)
        timer.daemon = True
        timer.start()

    setattr(schedule_reevaluation, _PATCHED, True)
    schedule_reevaluation.__wrapped__ = original
    JobScheduler._schedule_reevalutation = schedule_reevaluation
    return True
