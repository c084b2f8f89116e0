"""A fork server of a test's own, for the runner's tests."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO


@pytest.fixture
def server(tmp_path):
    """A fork server that preloads numpy only (seconds less than torch) and takes SIGINT as Python
    does by default (pytest-xdist's workers ignore it, and a child inherits that): its socket path."""
    path = tmp_path / "s.sock"
    code = ("import signal, sys; from pathlib import Path; import pipeline_src.runner.forkserver as f; "
            "signal.signal(signal.SIGINT, signal.default_int_handler); "
            "f.PRELOAD = ('numpy',); f.PRELOAD_STEPS = False; f.IDLE_SECONDS = 20; f.serve(Path(sys.argv[1]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the fork server did not start"
        time.sleep(0.02)
    yield path
    proc.kill()
    proc.wait()
