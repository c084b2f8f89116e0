"""The DP release folder (`release` rule, docs/privacy.md) against a reader who compares two
studies: trained on sets that differ by one sample, their release folders differ only in the DP
models' weights, their DP accuracies and `created_at`. A tiny privacy-only study built from
scratch (one method, one regime, one ε, one epoch); the neighbour reuses everything but the
DP jobs, with one sample dropped from its shard manifest."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import stat
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline_src.methods.export import load_exported
from pipeline_src.steps.privacy.release import COLUMNS
from tests.conftest import results_of, snakemake
from tests.e2e.conftest import tiny_dp_config

pytestmark = pytest.mark.e2e
DP_ONLY = ("private", "metrics/private", "release", "logs/train_private", "logs/evaluate_private", "logs/release")


@pytest.fixture
def umask_022():
    old = os.umask(0o022)  # the usual umask: files 0644, folders 0755 unless the study tightens them
    yield
    os.umask(old)


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory) -> tuple[Path, Path]:
    old = os.umask(0o022)
    try:
        return _neighbours(tmp_path_factory)
    finally:
        os.umask(old)


def _neighbours(tmp_path_factory) -> tuple[Path, Path]:
    a = tmp_path_factory.mktemp("release_a")
    (a / "config.yaml").write_text(yaml.safe_dump(tiny_dp_config()))
    snakemake(a, "--cores", "2", "release")
    b = tmp_path_factory.mktemp("release_b")
    shutil.copytree(a / "results", b / "results", copy_function=shutil.copy2,
                    ignore=lambda d, names: [n for n in names if any(
                        (Path(d) / n).match(f"*/results/*/{p}") for p in DP_ONLY)])
    shutil.copytree(a / ".snakemake" / "metadata", b / ".snakemake" / "metadata", copy_function=shutil.copy2)
    shutil.copy2(a / "config.yaml", b / "config.yaml")
    manifest = results_of(b) / "split" / "n1_s0" / "shard0.parquet"
    table = pq.read_table(manifest)
    pq.write_table(table.slice(1), manifest)  # D' = D minus its first sample
    snakemake(b, "--cores", "2", "release")
    logs = [next((results_of(w) / "logs" / "train_private").rglob("*.log")).read_text() for w in (a, b)]
    sizes = [int(re.search(r"DP-trained .* on (\d+) samples", t).group(1)) for t in logs]
    assert sizes[1] == sizes[0] - 1  # the neighbour's DP job trained on one sample fewer
    return results_of(a) / "release", results_of(b) / "release"


def _files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}


def test_neighbouring_studies_release_the_same_folder_but_weights_accuracies_and_times(neighbours):
    a, b = neighbours
    fa, fb = _files(a), _files(b)
    assert fa.keys() == fb.keys()
    assert {"README.md", "privacy_report.csv", "privacy_report.md", "backbone/model.safetensors",
            "models/ours/taft-1/fc/eps8/n1_s0/shard0/model.json"} <= fa.keys()
    differ = {k for k in fa if fa[k].read_bytes() != fb[k].read_bytes()}
    weights = {k for k in fa if k.startswith("models/") and k.endswith("/model.safetensors") and "/backbone/" not in k}
    assert weights <= differ  # the DP draws differ (the noise is secret)
    for k in differ - weights:
        if k.endswith("model.json"):
            ra, rb = (json.loads(f[k].read_text()) for f in (fa, fb))
            assert ra.pop("created_at") != rb.pop("created_at") and ra == rb, k
        elif k.endswith(".csv") or k.endswith(".md"):
            sep = "," if k.endswith(".csv") else "|"
            acc = COLUMNS.index("accuracy") + (1 if sep == "|" else 0)
            rows = [[r.split(sep) for r in f[k].read_text().splitlines()] for f in (fa, fb)]
            assert [[c for i, c in enumerate(r) if i != acc] for r in rows[0]] == \
                   [[c for i, c in enumerate(r) if i != acc] for r in rows[1]], k
        else:
            raise AssertionError(f"{k} differs between neighbouring studies")


def test_the_release_holds_dp_models_and_dp_parameters_only(neighbours):
    a, _ = neighbours
    rows = list(csv.DictReader((a / "privacy_report.csv").read_text().splitlines()))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 1
    r = rows[0]
    assert (r["protocol"], r["method"], r["regime"], r["N"], r["model"]) == ("ours", "taft-1", "fc", "1", "shard0")
    assert float(r["epsilon_spent"]) <= float(r["target_epsilon"]) == 8 and float(r["C"]) == 1.0
    assert 0 < float(r["q"]) <= 1 and int(r["steps"]) > 0 and float(r["sigma"]) > 0 and 0 <= float(r["accuracy"]) <= 1
    text = "\n".join(p.read_text(errors="ignore") for p in a.rglob("*") if p.suffix in (".json", ".md", ".csv"))
    for leak in ("wall_time", "num_samples", "sample_ids", "membership_ref", "non-private"):
        assert leak not in text, leak
    model, record, _ = load_exported(a / "models/ours/taft-1/fc/eps8/n1_s0/shard0")
    assert record["privacy"]["epsilon_spent"] == pytest.approx(float(r["epsilon_spent"]))
    shared = (a / "backbone" / "model.safetensors").stat().st_ino
    assert (a / "models/ours/taft-1/fc/eps8/n1_s0/shard0/backbone/model.safetensors").stat().st_ino == shared


def _open_paths(root: Path) -> list[str]:
    return [f"{p} {stat.S_IMODE(p.stat().st_mode):o}" for p in [root, *root.rglob("*")]
            if not p.is_symlink() and stat.S_IMODE(p.stat().st_mode) & 0o077]


def test_everything_a_dp_study_writes_is_owner_only_under_umask_022(neighbours):
    a, b = (r.parent.parent.parent for r in neighbours)
    for w in (a, b):  # the study's own folder (results/ itself holds every study's)
        assert _open_paths(results_of(w)) == [] and _open_paths(w / ".snakemake" / "metadata") == []
        assert stat.S_IMODE((results_of(w) / "split" / "n1_s0" / "shard0.parquet").stat().st_mode) == 0o600
        assert stat.S_IMODE((results_of(w) / "split").stat().st_mode) == 0o700


def test_enabling_privacy_late_closes_what_a_non_dp_study_wrote(tmp_path, umask_022):
    """The N = 2 manifests and non-DP records of an earlier non-DP run are closed by the first
    real run that has privacy enabled, before any of its jobs; a dry run changes no mode (issue 44)."""
    cfg = tiny_dp_config()
    cfg["privacy"]["enabled"] = False
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    study = results_of(tmp_path)
    old = [study / "split/n2_s0/shard1.parquet", study / "train/nlft-1/n2_s0/shard1.json",
           study / "prepare/samples.parquet"]
    for p in old:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("written by a non-DP study")
    snakemake(tmp_path, "-n", "--cores", "1", "evaluate_all")
    assert stat.S_IMODE(old[0].stat().st_mode) == 0o644 and _open_paths(study)  # not a DP study yet
    cfg["privacy"]["enabled"] = True
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(tmp_path, "-n", "--cores", "1", "release")
    assert stat.S_IMODE(old[0].stat().st_mode) == 0o644  # a dry run writes nothing, modes included
    # the cheapest real run: one `prepare` job (which rewrites the old samples file)
    snakemake(tmp_path, "results/tiny/prepare/samples.parquet", "--cores", "1", "--forcerun", "prepare")
    assert _open_paths(study) == []
    assert [stat.S_IMODE(p.stat().st_mode) for p in old] == [0o600] * 3
    assert stat.S_IMODE((study / "split" / "n2_s0").stat().st_mode) == 0o700
