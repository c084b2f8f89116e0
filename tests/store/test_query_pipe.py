"""The query CLI piped into a reader that stops early (`| head`) exits quietly (issue 24, item 8)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
