"""The per-study run lock (plan/study_lock.py) between real processes: a second holder is refused
naming the first, the lock ends with its process (even SIGKILLed), and studies do not share it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_src.plan.study_lock import StudyRunning, lock_path, refuse_unlock_while_running, running_holder
from tests.conftest import REPO

HOLD = ("import sys, time; from pipeline_src.plan.study_lock import lock_study; lock_study(sys.argv[1], sys.argv[2]); "
        "print('held', flush=True); time.sleep(600)")


def hold(study: str, snakemake_dir: Path) -> subprocess.Popen:
    """A process that holds `study`'s lock until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, study, str(snakemake_dir)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def try_lock(study: str, snakemake_dir: Path) -> subprocess.CompletedProcess:
    """Another process (a POSIX lock probed from this one would be this one's) tries to take it."""
    code = ("import sys; from pipeline_src.plan.study_lock import lock_study, StudyRunning\n"
            "try: lock_study(sys.argv[1], sys.argv[2])\n"
            "except StudyRunning as e: sys.exit(str(e))")
    return subprocess.run([sys.executable, "-c", code, study, str(snakemake_dir)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_running_study_refuses_a_second_run_and_unlock_until_its_process_dies(tmp_path):
    smk = tmp_path / ".snakemake"
    first = hold("tiny", smk)
    try:
        second = try_lock("tiny", smk)
        assert second.returncode == 1
        assert f"study 'tiny' is running already in this folder (Snakemake pid {first.pid} on " in second.stderr
        assert try_lock("tiny-b", smk).returncode == 0  # another study runs beside it
        assert running_holder("tiny", smk).startswith(f"Snakemake pid {first.pid} ")
        with pytest.raises(StudyRunning, match="nothing was unlocked"):
            refuse_unlock_while_running("tiny", smk)
        # Snakemake's own lock folder going (another study's run ended, an --unlock) changes nothing.
        assert lock_path("tiny", smk).parent == smk / "study_locks"
        assert try_lock("tiny", smk).returncode == 1
    finally:
        first.send_signal(signal.SIGKILL)  # a killed run leaves no lock behind: the kernel drops it
        first.wait()
    assert running_holder("tiny", smk) is None
    refuse_unlock_while_running("tiny", smk)
    assert try_lock("tiny", smk).returncode == 0

