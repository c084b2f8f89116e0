"""What the fork server preloads (`forkserver.PRELOAD` and the step modules): what the jobs import,
so that no job's child pays an import, and nothing only one job needs (issue 44)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

PRELOADED = ("import importlib, json, sys\nfrom pipeline_src.runner import forkserver\n"
             "for m in forkserver.PRELOAD: importlib.import_module(m)\nforkserver.preload_steps()\n"
             "before = {m.partition('.')[0] for m in sys.modules}\n")


def _fresh(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", PRELOADED + code], capture_output=True, text=True, env=env,
                         cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_preload_leaves_out_scikit_learn_and_matplotlib():
    # scikit-learn cost 0.6-1 CPU-s of every server's start for the digits alone (read from its CSV now)
    got = _fresh("print(json.dumps(sorted(k for k in ('sklearn', 'matplotlib') if k in sys.modules)))")
    assert got == []


def test_a_jobs_metrics_file_imports_nothing_after_the_preload(tmp_path):
    # pyarrow imports pandas at its first conversion of Python values: without pandas preloaded,
    # every job that writes its metrics paid 0.15-0.3 CPU-s for it (measured: the default study's
    # tiny jobs' CPU rose 6x when the preload lost scikit-learn, which had brought pandas)
    code = ("import torch\nfrom pipeline_src.store.metrics import metric_rows, write_metrics\n"
            "rows = metric_rows({'accuracy': 0.9}, context={'method': 'fc', 'shards': 1, 'split': 'test'},\n"
            "                   device=torch.device('cpu'), wall_time_s=1.0)\n"
            f"write_metrics(rows, {str(tmp_path / 'm.parquet')!r})\n"
            "print(json.dumps(sorted({m.partition('.')[0] for m in sys.modules} - before)))")
    assert _fresh(code) == []
