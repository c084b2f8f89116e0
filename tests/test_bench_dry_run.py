"""benchmarks/bench_dry_run.py: one repeat of the default study's cold dry run and of the floor
(a one-rule Snakefile), as rows, the floor's median on the study's row."""
from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq

from tests.conftest import REPO


def test_a_repeat_writes_the_floor_and_the_study_with_its_job_count(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_dry_run.py"), "--study", "default",
                           "--repeats", "1", "--out-dir", str(tmp_path)], capture_output=True, text=True, check=True)
    assert "over the floor" in proc.stdout
    rows = {r["case"]: r for r in pq.read_table(tmp_path / "dry_run.parquet").to_pylist()}
    assert set(rows) == {"floor", "default"}
    floor, study = (json.loads(rows[c]["sizes"]) for c in ("floor", "default"))
    assert floor["jobs"] == 1 and floor["study"] == "one-rule Snakefile"
    assert study["jobs"] > 100 and study["study"] == "config.yaml" and study["cold"] is True
    assert study["floor_ms_median"] == floor["floor_ms_median"] == round(rows["floor"]["time_ms_median"], 1)
