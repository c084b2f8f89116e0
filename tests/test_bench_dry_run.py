"""benchmarks/bench_dry_run.py: one repeat of the default study's cold dry run and of the floor
(a one-rule Snakefile), as rows, the floor's median on the study's row."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("bench_dry_run", REPO / "benchmarks" / "bench_dry_run.py")
bench_dry_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_dry_run)


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


def test_the_instruction_count_is_read_from_cachegrinds_summary():
    instruction_count = bench_dry_run.instruction_count
    summary = "==8667== \n==8667== I   refs:      3,335,340,101\n"
    assert instruction_count("snakemake's output\n" + summary) == 3_335_340_101
    with pytest.raises(RuntimeError, match="no cachegrind summary"):
        instruction_count("Nothing to be done.\n")


@pytest.mark.long
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instructions_are_counted_for_the_floor():
    # the floor only: ~30 s under valgrind, where the default study would take a minute more
    cpu, wall, rss, jobs, instructions = bench_dry_run.dry_run(sys.executable, None, count_instructions=True)
    assert jobs == 1 and instructions > 1e9  # Snakemake's start alone executes billions
