"""Stopping a Snakemake run now (`runner/stop_run.py`, issue 44): SIGINT to its process group ends
its running jobs and Snakemake within seconds, where SIGTERM or SIGINT to Snakemake alone wait for
the jobs. Real Snakemake runs of a one-rule workflow whose job sleeps."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_src.runner.stop_run import start_snakemake, stop_snakemake

SNAKEFILE = """
rule all:
    input: "done.txt"

rule slow:
    output: "done.txt"
    shell: "{trap}touch started && sleep 120 && touch {{output}}"
"""


def session(pid: int) -> list[int]:
    """The processes of the session `pid` leads (Snakemake, the shells and jobs it started)."""
    out = subprocess.run(["ps", "-o", "pid=", "-s", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def started_run(tmp_path: Path, trap: str = "") -> subprocess.Popen:
    """A run of the one-rule workflow, once its job sleeps."""
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(trap=trap))
    proc = start_snakemake([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    return proc


def test_a_sigint_to_the_runs_group_stops_its_job_now(tmp_path):
    proc = started_run(tmp_path)
    t0 = time.monotonic()
    how = stop_snakemake(proc, grace_s=60)
    assert how == "sigint" and time.monotonic() - t0 < 30  # the job alone would sleep 120 s
    time.sleep(0.5)
    assert session(proc.pid) == [], "a job of the stopped run still runs"
    assert not list((tmp_path / ".snakemake" / "locks").glob("*")), "the lock stays"
    assert not (tmp_path / "done.txt").exists()


def test_a_job_that_ignores_sigint_is_left_to_the_sigkill_fallback(tmp_path):
    proc = started_run(tmp_path, trap="trap '' INT; ")
    try:
        assert stop_snakemake(proc, grace_s=3) == "sigkill" and proc.returncode == -signal.SIGKILL
    finally:
        for pid in session(proc.pid):  # a plain shell job has no orphan guard (the pipeline's jobs do)
            os.kill(pid, signal.SIGKILL)


def test_a_run_outside_a_group_of_its_own_is_refused(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ValueError, match="not a process group of its own"):
            stop_snakemake(proc)
    finally:
        proc.kill()
        proc.wait()
    assert stop_snakemake(proc) == "exited"
