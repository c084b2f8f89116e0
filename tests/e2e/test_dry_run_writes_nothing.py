"""A dry run and `--lint` leave `results/` as they found it; a run that starts jobs keeps the
validation cache (issue 33, item 6)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, results_of, snakemake

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

    snakemake(tmp_path, "--cores", "1", "results/tiny/prepare/samples.parquet")  # a run that starts a job
    cache = sorted((results_of(tmp_path) / "prepare" / ".plan_cache").glob("*.json"))
    assert cache, "a real run keeps what validation derived"
    before = tree(tmp_path / "results")
    snakemake(tmp_path, "-n", "--cores", "2")
    assert tree(tmp_path / "results") == before


def test_a_dry_run_of_a_dp_study_changes_no_mode(tmp_path):
    """Issue 44, 5.7: with privacy enabled, a dry run made every file of the study 0600 (a real run
    does: docs/privacy.md); a dry run writes nothing, modes included, and makes no provenance key
    (issue 43: its keyed rerun triggers say only that there is no key yet)."""
    import stat

    import yaml

    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["privacy"] = {"enabled": True, "public_train_size": 500}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    made = [results_of(tmp_path) / "prepare" / "notes.txt", tmp_path / ".snakemake" / "metadata" / "record"]
    for f in made:
        f.parent.mkdir(parents=True)
        f.write_text("x")
        f.chmod(0o644)
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in [*made, *(f.parent for f in made)]}
    snakemake(tmp_path, "-n", "--cores", "2")
    assert {p: stat.S_IMODE(p.stat().st_mode) for p in modes} == modes
    assert not (results_of(tmp_path) / "provenance").exists()
