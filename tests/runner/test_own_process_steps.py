"""The steps that run in a process of their own even where the fork server runs the others
(`launch.OWN_PROCESS_STEPS`): they must import no torch, or each would pay seconds for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline_src.runner import forkserver, launch
from pipeline_src.runner.job_process import JobExit
from pipeline_src.runner.step_args import StepArgs
from tests.conftest import REPO

# What a job process imports before its step's main: the job process, `execute`, the job's counters.
JOB_PROCESS_IMPORTS = ("pipeline_src.runner.job_process", "pipeline_src.runner.execute", "pipeline_src.store.job_counters")


@pytest.mark.parametrize("step", sorted(launch.OWN_PROCESS_STEPS))
def test_a_step_of_its_own_process_imports_no_torch(step):
    code = ("import importlib, json, sys\n"
            f"for m in {JOB_PROCESS_IMPORTS + ('pipeline_src.steps.' + step,)!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(k for k in ('torch', 'timm', 'opacus') if k in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_launch_runs_them_in_their_own_process_and_the_others_in_the_fork_server(monkeypatch):
    ran = []
    monkeypatch.delenv("PIPELINE_FORKSERVER", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(forkserver, "run_in_server", lambda step, *a, **k: ran.append(("server", step)) or JobExit(0, None))
    monkeypatch.setattr(launch, "run_measured", lambda step, *a, **k: ran.append(("own", step)) or JobExit(0, None))
    for step in ("signature", "forget.manifest", "train"):
        assert launch.launch(step, StepArgs()) == 0
    assert ran == [("own", "signature"), ("own", "forget.manifest"), ("server", "train")]
