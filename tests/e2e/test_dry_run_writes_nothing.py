"""A dry run and `--lint` leave `results/` as they found it; a run that starts jobs keeps the
validation cache (issue 33, item 6)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, snakemake

pytestmark = pytest.mark.e2e


def tree(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_dry_run_and_lint_write_nothing_a_real_run_caches(tmp_path):
    (tmp_path / "config.yaml").write_text((REPO / ".test" / "config.yaml").read_text())
    snakemake(tmp_path, "-n", "--cores", "2")
    assert not (tmp_path / "results").exists(), sorted(tree(tmp_path / "results"))
    lint = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert lint.returncode == 0, lint.stderr[-2000:]
    assert not (tmp_path / "results").exists()

    snakemake(tmp_path, "--cores", "1", "results/prepare/samples.parquet")  # a run that starts a job
    cache = sorted((tmp_path / "results" / "prepare" / ".plan_cache").glob("*.json"))
    assert cache, "a real run keeps what validation derived"
    before = tree(tmp_path / "results")
    snakemake(tmp_path, "-n", "--cores", "2")
    assert tree(tmp_path / "results") == before
