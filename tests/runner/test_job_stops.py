"""Ctrl-C stops jobs whose client is a thread of Snakemake's process (`runner/job_stops.py`).

A rule's `run:` block waits for its job in a thread of the main Snakemake process, and the job
runs in a session of its own, so the SIGINT of Ctrl-C reaches neither. The reference is a real
fork server running a probe job that sleeps for a minute: stopped through the handler, it must
end within seconds, killed by that SIGINT.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pipeline_src.runner import job_stops
from pipeline_src.runner.forkserver import run_in_server


@pytest.fixture
def restore_sigint():
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def test_sigint_stops_every_registered_job_then_runs_the_handler_before(restore_sigint):
    calls = []
    signal.signal(signal.SIGINT, lambda signum, _frame: calls.append(("previous", signum)))
    assert job_stops.forward_interrupts()
    assert not job_stops.forward_interrupts()  # once: a second call would stop each job twice
    with job_stops.stoppable(lambda s: calls.append(("a", s))), job_stops.stoppable(lambda s: calls.append(("b", s))):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs between bytecodes of this thread
    assert calls == [("a", signal.SIGINT), ("b", signal.SIGINT), ("previous", signal.SIGINT)]
    calls.clear()
    os.kill(os.getpid(), signal.SIGINT)  # no job runs any more: only the previous handler
    time.sleep(0.05)
    assert calls == [("previous", signal.SIGINT)]


def test_without_a_handler_before_it_raises_keyboard_interrupt(restore_sigint):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    job_stops.forward_interrupts()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)


def test_in_a_thread_the_stop_is_registered_and_no_handler_is_set():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    got, seen = [], []

    def job():
        with job_stops.stopped_by_signals(got.append):
            seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
            seen.append(job_stops.stop_all(signal.SIGINT))

    t = threading.Thread(target=job)
    t.start()
    t.join()
    assert seen == [before, 1] and got == [signal.SIGINT]
    assert job_stops.stop_all(signal.SIGINT) == 0  # unregistered when the job ended


def test_a_threads_fork_server_job_ends_at_once_when_stopped(server):
    done = []
    t = threading.Thread(target=lambda: done.append(run_in_server("60", None, call="tests.runner.rss_probe:sleep",
                                                                  path=server)))
    t.start()
    deadline = time.monotonic() + 20
    while job_stops.stop_all(0) == 0:  # signal 0: only whether the child is there yet
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.02)
    t0 = time.monotonic()
    assert job_stops.stop_all(signal.SIGINT) == 1
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    assert done[0].code != 0  # the probe's KeyboardInterrupt, not a finished minute


def test_an_ignored_sigint_stays_ignored(restore_sigint):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a script's background job
    assert not job_stops.forward_interrupts()
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
