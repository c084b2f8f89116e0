"""Each job's exact peak RSS, measured by the process that reaps it (`os.wait4`), in both ways a
job runs: its own process (`runner/job_process.py`) and a fork-server child (`runner/forkserver.py`).

The reference is a probe child that allocates and touches a known number of MiB
(`tests/runner/rss_probe.py`): its figure must exceed an idle probe's by at least that much, and
memory allocated in an atexit handler (after the job's own `[launch] peak RSS` line) must count.
The job processes are started from a small parent, as a job's client is (about 27 MB): an exec'd
child's `ru_maxrss` starts at its parent's RSS, and this test process holds torch.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from pipeline_src.runner import launch
from pipeline_src.runner.forkserver import run_in_server
from pipeline_src.runner.job_process import JobExit, run_measured
from pipeline_src.runner.step_args import Paths, StepArgs
from pipeline_src.store.job_rss import read_job_rss, rss_path
from tests.conftest import REPO

PROBE = "tests.runner.rss_probe:allocate"
MB = 64  # the reference allocation
LINE = re.compile(r"^\[launch\] peak RSS ([\d.]+) MB", re.M)


def measured(step: str, call: str = PROBE, log: Path | None = None) -> JobExit:
    """`run_measured` from a small client process (a fresh Python that imports only the runner)."""
    code = ("import json, sys; from pipeline_src.runner.job_process import run_measured; "
            "from pipeline_src.runner.step_args import Paths, StepArgs; step, call, log = json.loads(sys.argv[1]); "
            "args = StepArgs(log=Paths([log]), rule='train') if log else None; "
            "done = run_measured(step, args, call=call); print(json.dumps([done.code, done.peak_kib]))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps([step, call, str(log) if log else None])],
                         cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    return JobExit(*json.loads(out.strip().splitlines()[-1]))


def test_a_job_process_reports_the_memory_it_touched():
    idle, busy = measured("0,0"), measured(f"{MB},0")
    assert idle.code == busy.code == 0
    # ru_maxrss of an exec'd process starts at its parent's RSS (the client's ~28 MB), which floors
    # the idle figure slightly above the idle job's own peak: 10 % slack, still far from zero
    assert busy.peak_kib - idle.peak_kib >= 0.9 * MB * 1024
    assert idle.peak_kib < 200 * 1024  # a Python with numpy


def test_the_peak_covers_the_shutdown_the_jobs_own_line_misses(tmp_path):
    """A job whose atexit handler allocates: the reaper's figure is above the job's last log line by that much."""
    log = tmp_path / "logs" / "train" / "shard0.log"
    done = measured(f"0,{2 * MB}", "tests.runner.rss_probe:execute_allocating", log)
    assert done.code == 0
    own = float(LINE.findall(log.read_text())[-1])  # the job's ru_maxrss before its shutdown
    assert done.peak_kib / 1024 >= own + MB, (done.peak_kib / 1024, own)


def test_a_killed_job_process_is_reaped_with_its_signal():
    done = measured("kill", "tests.runner.rss_probe:die")
    assert done.code == 128 + 9 and done.peak_kib is not None


def test_a_fork_server_child_reports_the_memory_it_touched(server):
    idle = run_in_server("0,0", None, call=PROBE, path=server)
    busy = run_in_server(f"{MB},0", None, call=PROBE, path=server)
    assert idle.code == busy.code == 0 and idle.peak_kib and busy.peak_kib
    # ru_maxrss of an exec'd process starts at its parent's RSS (the client's ~28 MB), which floors
    # the idle figure slightly above the idle job's own peak: 10 % slack, still far from zero
    assert busy.peak_kib - idle.peak_kib >= 0.9 * MB * 1024
    again = run_in_server("0,0", None, call=PROBE, path=server)  # each child its own peak, not the last one's
    assert again.peak_kib - idle.peak_kib < MB * 1024 // 2
    killed = run_in_server("kill", None, call="tests.runner.rss_probe:die", path=server)
    assert killed.code == 128 + 9 and killed.peak_kib is not None  # the server's word: the child sent none


def test_the_client_leaves_its_signal_handlers_as_it_found_them(server):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert run_in_server("0,0", None, call=PROBE, path=server).code == 0
    assert run_in_server("kill", None, call="tests.runner.rss_probe:die", path=server).code == 128 + 9
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_launch_writes_the_peak_beside_the_log(tmp_path, monkeypatch):
    log = tmp_path / "logs" / "train" / "shard0.log"
    log.parent.mkdir(parents=True)
    rss_path(log).write_text("{}")  # a former run's file: replaced, or removed if no figure comes
    monkeypatch.setenv("PIPELINE_FORKSERVER", "0")  # the job's own process (the server's path: above)
    monkeypatch.setattr(launch, "stop_with_run", lambda group: None)  # no guard thread in the test process
    args = StepArgs(log=Paths([str(log)]), rule="train")
    monkeypatch.setattr(launch, "run_measured", lambda step, args, on_child, **kw: run_measured(
        step, args, on_child, call="tests.runner.rss_probe:execute_allocating", **kw))
    assert launch.launch(f"{MB},0", args) == 0
    row = read_job_rss(rss_path(log))
    assert row["measured_by"] == "wait4: job process" and row["exit_code"] == 0
    # never below the job's own line, which is rounded to 0.1 MB (869.5625 MB printed as 869.6)
    assert row["peak_rss_mb"] >= float(LINE.findall(log.read_text())[-1]) - 0.05
    monkeypatch.setattr(launch, "run_measured", lambda step, args, on_child, **kw: JobExit(3, None))
    assert launch.launch("0,0", args) == 3
    assert not rss_path(log).exists()  # no figure: the old one is gone, not shown as this run's
