"""float16 feature caches (the default) against float32 on the tiny study: the session's tiny
study (float16 caches, tests/e2e/conftest.py) against a copy of its prepared part run with
`features.dtype=float32`, which reruns only `features`, the shard jobs and their evaluation. Every method that trains from
a cache (fc, nlft-1, taft-1, last) at N = 1 and 2 must keep its test accuracy within TOLERANCE
of the float32 run (measured on the whole tiny study: see docs/performance.md, "Real scale").
"""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.conftest import REPO, results_of, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e

# Measured on the whole tiny study (26 accuracy rows: every method, shard, soup and ensemble):
# float16 moved no accuracy at all (0 of 280 test samples) and test losses by < 4e-7.
TOLERANCE = 2 / 280  # two test samples
METHODS = ("fc", "nlft-1", "taft-1", "last")


def accuracies(workdir: Path) -> dict[tuple, float]:
    rows = duckdb.sql(f"""SELECT method, model, shards, shard_id, value FROM
        read_parquet('{results_of(workdir)}/metrics/evaluate/**/*.parquet', union_by_name=true)
        WHERE metric = 'accuracy'""").fetchall()
    return {r[:4]: r[4] for r in rows}


def pinned_methods(cfg: dict, study: Path) -> tuple[dict, dict]:
    """`METHODS` with each searched one split into `<name>-at-n<N>`, trained at N only at the point the
    study's `select` chose there (`plan/selected_point.apply_selection`), so a run without the search
    trains what the searched study trained; and the map back to the study's names."""
    methods, names = {}, {}
    for name in METHODS:
        record = results_of(study) / "select" / f"{name}.json"
        if not record.is_file():
            methods[name], names[name] = cfg["methods"][name], name
            continue
        for choice in json.loads(record.read_text())["choices"]:
            pinned = f"{name}-at-n{choice['shards']}"
            methods[pinned] = {**cfg["methods"][name], "shards": [choice["shards"]], "lr": choice["lr"]}
            if choice["pt"] is not None:
                methods[pinned]["reset"] = not choice["pt"]
            if choice["cls"] is not None:
                methods[pinned]["reset_cls"] = choice["cls"]
            names[pinned] = name
    return methods, names


def test_float16_caches_keep_the_float32_accuracies(tmp_path, tiny_study):
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["device"] = "cpu"
    # the search's choices pinned, not searched again: float32 may select another point
    cfg["methods"], names = pinned_methods(cfg, tiny_study)
    cfg["search"] = {"enabled": False}
    for study in ("fusion", "forget", "last_grid"):
        cfg.pop(study, None)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    copy_study(tiny_study, tmp_path)  # its float16 caches: the float32 run rebuilds them
    snakemake(tmp_path, "--cores", "2", "evaluate_all", "--config", "features={'dtype': 'float32'}")
    f32 = {(names[k[0]], *k[1:]): v for k, v in accuracies(tmp_path).items()}
    # the session's tiny study is the same study with the default float16 caches
    f16 = {k: v for k, v in accuracies(tiny_study).items() if k[0] in METHODS}
    assert f16.keys() == f32.keys() and len(f32) == len(METHODS) * (1 + 2 + 2)
    worst = max(f32, key=lambda k: abs(f16[k] - f32[k]))
    assert abs(f16[worst] - f32[worst]) <= TOLERANCE, (worst, f32[worst], f16[worst])
