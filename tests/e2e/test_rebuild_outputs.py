"""A broken and a deleted output of a finished study are rebuilt by the next run after
`check_outputs --rebuild` (issue 44, 5.4: a broken metrics file looks up to date to Snakemake, and
deleting it gave "Nothing to be done" there, its rows silently missing from the study)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import duckdb
import pytest

from tests.conftest import REPO, planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e


def metric_rows(workdir) -> int:
    return duckdb.sql(f"SELECT count(*) FROM read_parquet('{results_of(workdir)}/metrics/**/*.parquet', "
                      "union_by_name=true)").fetchall()[0][0]


def test_the_next_run_rebuilds_what_check_outputs_lists(tiny_study, tmp_path):
    work = copy_study(tiny_study, tmp_path / "study", parts=None)
    shutil.copy(tiny_study / "config.yaml", work / "config.yaml")
    rows = metric_rows(work)
    broken = results_of(work) / "metrics" / "evaluate" / "fc" / "n2_s0" / "shards.parquet"
    deleted = results_of(work) / "metrics" / "evaluate" / "last" / "n2_s0" / "shards.parquet"
    broken.write_bytes(broken.read_bytes()[:100])
    deleted.unlink()

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline_src.store.check_outputs", "--study", "tiny", *args],
                              capture_output=True, text=True, cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)})

    listed = check()
    assert listed.returncode == 1 and "BROKEN results/tiny/metrics/evaluate/fc/n2_s0/shards.parquet" in listed.stdout
    assert "MISSING results/tiny/metrics/evaluate/last/n2_s0/shards.parquet" in listed.stdout, listed.stdout
    assert check("--rebuild").returncode == 0
    run = snakemake(work, "--cores", "2")
    assert "2 file(s) deleted by a killed run or check_outputs --rebuild are rebuilt" in run.stdout + run.stderr
    assert metric_rows(work) == rows  # every row back, read whole
    assert check().returncode == 0
    assert planned_outputs(snakemake(work, "-n")) == []


def test_deleted_per_image_files_are_outputs_that_the_next_run_rebuilds(tiny_study, tmp_path):
    """Per-image files are outputs of the rules that write them (evaluate, unlearning, fusion):
    check_outputs sees them gone, and the next run reruns the jobs that write them (before, they
    were no output: nothing listed or rebuilt them)."""
    work = copy_study(tiny_study, tmp_path / "study", parts=None)
    shutil.copy(tiny_study / "config.yaml", work / "config.yaml")
    deleted = ("per_image/evaluate/fc/n2_s0/shards.parquet", "per_image/unlearn_drop/taft-1/n3_s0.parquet",
               "per_image/fuse/random_reinit/nlft-1/n2_s0/none/soup.parquet")
    for rel in deleted:
        (results_of(work) / rel).unlink()
    check = subprocess.run([sys.executable, "-m", "pipeline_src.store.check_outputs", "--study", "tiny", "--rebuild"],
                           capture_output=True, text=True, cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert check.returncode == 0 and all(f"MISSING results/tiny/{rel}" in check.stdout for rel in deleted), check.stdout
    planned = " ".join(planned_outputs(snakemake(work, "-n", "--cores", "2")))
    assert all(f"results/tiny/{rel}" in planned for rel in deleted), planned
