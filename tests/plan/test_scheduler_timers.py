"""plan/scheduler_timers: Snakemake's scheduler keeps one re-evaluation timer pending, not a chain
per pass (the real JobScheduler method, patched and restored around each test)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from snakemake.scheduling.job_scheduler import JobScheduler

from pipeline_src.plan.scheduler_timers import keep_one_reevaluation_timer


def snakemake_own():
    """Snakemake's method, even where a Snakemake run in this process has patched it."""
    method = JobScheduler._schedule_reevalutation
    return getattr(method, "__wrapped__", method)


@pytest.fixture
def patched():
    original = snakemake_own()
    JobScheduler._schedule_reevalutation = original
    assert keep_one_reevaluation_timer() is True
    yield
    JobScheduler._schedule_reevalutation = original


def wakeups(scheduler, within: float) -> int:
    count, deadline = 0, time.monotonic() + within
    while scheduler._open_jobs.acquire(timeout=max(deadline - time.monotonic(), 0.001)):
        count += 1
    return count


def test_unpatched_snakemake_starts_a_timer_per_pass():
    # the behaviour the patch exists for: every call is one more wake-up
    scheduler = SimpleNamespace(_open_jobs=threading.Semaphore(0))
    for _ in range(5):
        snakemake_own()(scheduler, 0.05)
    assert wakeups(scheduler, 0.3) == 5


def test_passes_while_a_timer_is_pending_add_none(patched):
    scheduler = SimpleNamespace(_open_jobs=threading.Semaphore(0))
    for _ in range(5):
        JobScheduler._schedule_reevalutation(scheduler, 0.05)
    assert wakeups(scheduler, 0.3) == 1
    JobScheduler._schedule_reevalutation(scheduler, 0.05)  # after it fired, the next pass sets one again
    assert wakeups(scheduler, 0.3) == 1


def test_each_scheduler_has_its_own_timer_and_it_does_not_hold_up_exit(patched):
    a, b = (SimpleNamespace(_open_jobs=threading.Semaphore(0)) for _ in range(2))
    JobScheduler._schedule_reevalutation(a, 0.05)
    JobScheduler._schedule_reevalutation(b, 0.05)
    assert wakeups(a, 0.3) == 1 and wakeups(b, 0.3) == 1
    JobScheduler._schedule_reevalutation(a, 60.0)
    assert all(t.daemon for t in threading.enumerate() if isinstance(t, threading.Timer))


def test_a_sooner_wakeup_is_not_held_back_by_a_later_pending_one(patched):
    scheduler = SimpleNamespace(_open_jobs=threading.Semaphore(0))
    JobScheduler._schedule_reevalutation(scheduler, 60.0)
    JobScheduler._schedule_reevalutation(scheduler, 0.05)
    assert wakeups(scheduler, 0.3) == 1


def test_patching_twice_is_refused(patched):
    assert keep_one_reevaluation_timer() is False
