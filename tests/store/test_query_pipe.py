"""The query CLI piped into a reader that stops early (`| head`) exits quietly (issue 24, item 8)."""
from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_src.store import query
from tests.conftest import REPO


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_piping_into_head_exits_quietly(tmp_path, fmt):
    (tmp_path / "results").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # 300,000 rows: far more than a pipe's buffer, so the writer is still writing when head exits
    query = subprocess.Popen([sys.executable, "-m", "pipeline_src.store.query", "--results", "results", "--format", fmt,
                              "SELECT range AS i FROM range(300000)"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-n", "3"], stdin=query.stdout, capture_output=True, text=True)
    query.stdout.close()  # only head holds the read end now: its exit breaks the pipe
    err = query.stderr.read().decode()
    assert query.wait() == 0, err
    assert err == ""
    assert head.stdout.splitlines()[1].strip() == "0"


def test_views_into_a_closed_pipe_exit_quietly(tmp_path):
    """`query --views | head -1`: the reader is gone before the listing is written (issue 33, item 8)."""
    (tmp_path / "results" / "prepare").mkdir(parents=True)
    pq.write_table(pa.table({"sample_id": ["a"], "split": ["train"]}), tmp_path / "results" / "prepare" / "samples.parquet")
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `head` does once it has its line: every write now breaks the pipe
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pipeline_src.store.query", "--views"], cwd=tmp_path, env=env,
                          stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_a_missing_results_folder_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert query.main(["SELECT * FROM metrics"]) == 1
    err = capsys.readouterr().err
    assert f"no results folder at {tmp_path / 'results'}" in err and "Catalog Error" not in err
    assert query.main(["--results", str(tmp_path / "elsewhere"), "--views"]) == 1
    assert str(tmp_path / "elsewhere") in capsys.readouterr().err
