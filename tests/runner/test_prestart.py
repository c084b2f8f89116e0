"""A fork server started in the background at a run's start (`forkserver.prestart`): a second start
is refused while it starts, and a job that asks meanwhile waits for that server instead of starting
another; the server hands the start lock back once it listens."""
from __future__ import annotations

import fcntl
import subprocess

import pytest

from pipeline_src.runner import forkserver
from pipeline_src.runner.launch import prestart_server, uses_fork_server

LIGHT = "tests.runner.light_server"


def servers_at(path) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"runner.* {path}"], capture_output=True, text=True).stdout.split()  # any server


def test_a_job_asking_while_the_server_starts_waits_for_that_server(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.sock"
    assert forkserver.prestart(path, module=LIGHT)
    assert not forkserver.prestart(path, module=LIGHT)  # being started: not a second one
    try:
        # `_ensure_server` as a job calls it, with the light server's module should it start one
        done = forkserver.run_in_server("x", None, call="operator:eq", path=path)
        assert done is not None and done.code == 0
        assert len(servers_at(path)) == 1
        with open(str(path) + ".lock", "w") as lock:  # handed back once listening
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not forkserver.prestart(path, module=LIGHT)  # one answers
    finally:
        for pid in servers_at(path):
            subprocess.run(["kill", pid])


@pytest.mark.parametrize("env, conda, uses", [({}, False, True), ({"PIPELINE_FORKSERVER": "0"}, False, False),
                                              ({"SLURM_JOB_ID": "7"}, False, False), ({}, True, False)])
def test_no_server_is_started_where_jobs_do_not_use_one(monkeypatch, env, conda, uses):
    for k in ("PIPELINE_FORKSERVER", "SLURM_JOB_ID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert uses_fork_server(conda) is uses
    if not uses:
        monkeypatch.setattr(forkserver, "prestart", lambda *a, **k: pytest.fail("started a server"))
        assert prestart_server(conda) is False
