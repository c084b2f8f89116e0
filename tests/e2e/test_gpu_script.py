"""The prepared GPU script (`benchmarks/run_gpu.sh`, `bench_gpu_study.py`; issue 41, item 5) end to
end in `--smoke` mode: every part on the CPU at tiny sizes, from tiny IDX files, into one Parquet
and Markdown table; and a phase out of time is stopped with its jobs and said so."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.plan.test_idx_files import make_idx

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_gpu_study import processes_in  # noqa: E402 (a script's folder, not a package)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def idx(tmp_path_factory) -> Path:
    """Fashion-MNIST-shaped IDX files: 28 x 28, 10 classes, 30 train and 10 test images a class."""
    root = tmp_path_factory.mktemp("idx")
    make_idx(root, n_train=300, n_test=100, classes=10, rows=28, cols=28)
    return root


def test_run_gpu_smoke_runs_every_part_into_one_table(tmp_path, idx):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "run_gpu.sh"), "--smoke", "--data", str(idx),
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = pq.read_table(out / "gpu_study.parquet").to_pylist()
    phases = {(r["part"], r["phase"]): r for r in rows if r["kind"] == "phase"}
    assert set(phases) == {("vitb", "pretrain"), ("vitb", "features"), ("vitb", "train"), ("vitb", "all"),
                           ("table2", "all"), ("fashion", "all"), ("near", "all"), ("near", "cross_regime")}
    assert all(r["finished"] for r in phases.values()), [(k, r["finished"]) for k, r in phases.items()]
    assert phases[("table2", "all")]["jobs_done"] == phases[("table2", "all")]["jobs_total"] > 0
    rules = {(r["part"], r["phase"]): r for r in rows if r["kind"] == "rule"}
    for part in ("vitb", "table2"):  # the ViT rules' figures come from each study's efficiency table
        for rule in ("features", "evaluate_shards"):
            assert rules[(part, rule)]["images_per_s"] > 0 and rules[(part, rule)]["gflop_per_s"] > 0
    assert all(r["dtype"] == "float32" and r["nominal_peak_pct"] is None for r in rules.values())  # CPU: no nominal peak
    table = (out / "gpu_study.md").read_text()
    assert "| part | row | phase / rule |" in table and "cross_regime" in table


def test_a_phase_out_of_time_is_stopped_with_its_jobs(tmp_path, idx):
    work, out = tmp_path / "work", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu_study.py"), "--smoke", "--data",
                           str(idx), "--part", "fashion", "--part", "near", "--workdir", str(work), "--out-dir",
                           str(out), "--cores", "2", "--cap", "fashion=12", "--budget", "16"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = pq.read_table(out / "gpu_study.parquet").to_pylist()
    fashion = next(r for r in rows if r["part"] == "fashion" and r["kind"] == "phase")
    assert fashion["finished"] is False and fashion["jobs_stopped_clean"] is True
    assert 8 < fashion["wall_s"] < 60  # stopped at its cap (uncapped, this smoke study took 16 s here), not run to the end
    near = next(r for r in rows if r["part"] == "near")
    assert near["finished"] is False and "spent" in near["note"]  # the budget left no time for it
    assert not processes_in(work), "a job of the stopped run still runs"
