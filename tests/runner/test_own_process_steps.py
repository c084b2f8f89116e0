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

# A real job of each step, run by `execute` as a job process runs it (its counters written too),
# then what it imported of the heavy libraries.
JOBS = {
    "signature": "StepArgs(output=Paths([out], {'signature': out}), params={'value': '{\"a\": 1}'}, "
                 "wildcards={'name': 'x'}, log=Paths([log]), rule='signature')",
    "forget.manifest": "StepArgs(output=Paths([out], {'manifest': out}), params={'members': ['a', 'b'], 'forgotten': ['b']}, "
                       "wildcards={'shard': '0'}, log=Paths([log]), rule='forget_manifest', runtime={'private_workspace': False})",
}


@pytest.mark.parametrize("step", sorted(launch.OWN_PROCESS_STEPS))
def test_a_job_of_its_own_process_imports_no_torch(step, tmp_path):
    out, log, result = tmp_path / "out", tmp_path / "job.log", tmp_path / "result.json"
    code = ("import json, sys\nfrom pipeline_src.runner.execute import execute\n"
            "from pipeline_src.runner.step_args import Paths, StepArgs\n"
            f"out, log = {str(out)!r}, {str(log)!r}\n"
            f"code = execute({step!r}, {JOBS[step]})\n"
            "heavy = sorted(k for k in ('torch', 'timm', 'opacus') if k in sys.modules)\n"
            f"open({str(result)!r}, 'w').write(json.dumps([code, heavy]))")  # stdout went to the job's log
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(result.read_text()) == [0, []], log.read_text()[-2000:]
    assert out.exists()


def test_launch_runs_them_in_their_own_process_and_the_others_in_the_fork_server(monkeypatch):
    ran = []
    monkeypatch.delenv("PIPELINE_FORKSERVER", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(forkserver, "run_in_server", lambda step, *a, **k: ran.append(("server", step)) or JobExit(0, None))
    monkeypatch.setattr(launch, "run_measured", lambda step, *a, **k: ran.append(("own", step)) or JobExit(0, None))
    for step in ("signature", "forget.manifest", "train"):
        assert launch.launch(step, StepArgs()) == 0
    assert ran == [("own", "signature"), ("own", "forget.manifest"), ("server", "train")]
