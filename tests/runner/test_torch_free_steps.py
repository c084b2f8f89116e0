"""The steps that need no torch import none when a job runs in a process of its own (inside a
Slurm job, or with `PIPELINE_FORKSERVER=0`): the job's counters once imported torch for its thread
count, 2.2-2.3 CPU-s of each signature and manifest job (29 in the default study)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# A real job of each step, run by `execute` as a job process runs it (its counters written too),
# then what it imported of the heavy libraries.
JOBS = {
    "signature": "StepArgs(output=Paths([out], {'signature': out}), params={'value': '{\"a\": 1}'}, "
                 "wildcards={'name': 'x'}, log=Paths([log]), rule='signature')",
    "forget.manifest": "StepArgs(output=Paths([out], {'manifest': out}), params={'members': ['a', 'b'], 'forgotten': ['b']}, "
                       "wildcards={'shard': '0'}, log=Paths([log]), rule='forget_manifest', runtime={'private_workspace': False})",
}


@pytest.mark.parametrize("step", sorted(JOBS))
def test_a_job_of_a_step_without_torch_imports_none(step, tmp_path):
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
