"""Golden accuracies of the tiny study (issue 17): an install from requirements.lock reproduces
the committed numbers on the CPU.

`tests/golden/tiny_accuracy.csv` holds every accuracy row of the `.test` study run on the CPU.
This test reruns the study and compares: the same rows, each within one evaluated sample
(|Δ| ≤ 1 / num_samples, so a single flipped prediction passes and anything more fails).

When a change means to move the numbers, regenerate and commit the file with the reason:

    make golden    # = PIPELINE_UPDATE_GOLDEN=1 pytest tests/e2e/test_golden.py

Library versions move numbers too. Where the installed versions differ from the lock the test
skips, naming them; `PIPELINE_REQUIRE_LOCKED_ENV=1` (set by CI, which installs from the lock)
makes it fail instead.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import duckdb
import pytest

from pipeline_src.plan.environment import LOCK_FILE, fingerprint, lock_drift_message
from tests.conftest import REPO, results_of

GOLDEN = REPO / "tests" / "golden" / "tiny_accuracy.csv"
KEY = ("method", "kind", "model", "shards", "shard_id", "seed", "split", "variant")
UPDATE = os.environ.get("PIPELINE_UPDATE_GOLDEN") == "1"


def accuracy_rows(workdir: Path) -> list[dict]:
    """The accuracy rows of a finished study in `workdir`, sorted by KEY."""
    cols = ", ".join(KEY)
    rows = duckdb.sql(f"""SELECT {cols}, num_samples, value AS accuracy FROM
        read_parquet('{results_of(workdir)}/metrics/**/*.parquet', union_by_name=true)
        WHERE metric = 'accuracy' ORDER BY ALL""").fetchall()
    return [dict(zip((*KEY, "num_samples", "accuracy"), r)) for r in rows]


def assert_fingerprinted(results: Path) -> None:
    """Every metrics row and model record of the study carries this environment's fingerprint
    (its versions; the commit and dirty flag may change while a developer edits during the run)."""
    versions = {k: v for k, v in fingerprint().items() if k not in ("commit", "dirty")}
    envs = duckdb.sql(f"""SELECT DISTINCT environment FROM
        read_parquet('{results}/metrics/**/*.parquet', union_by_name=true)""").fetchall()
    records = sorted((results / "train").rglob("*.json")) + sorted((results / "compose").rglob("*.json"))
    found = [json.loads(e) for (e,) in envs] + [json.loads(r.read_text())["environment"] for r in records]
    assert envs and records and all(e is not None for e in found)
    assert all({k: e[k] for k in versions} == versions and set(e) == {*versions, "commit", "dirty"} for e in found)


def key_of(row: dict) -> tuple[str, ...]:
    return tuple("" if row[k] is None else str(row[k]) for k in KEY)


def write_golden(rows: list[dict]) -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    tmp = GOLDEN.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow((*KEY, "num_samples", "accuracy"))
        for r in rows:
            w.writerow((*key_of(r), r["num_samples"], repr(float(r["accuracy"]))))
    tmp.replace(GOLDEN)


def read_golden() -> dict[tuple[str, ...], tuple[int, float]]:
    with GOLDEN.open(newline="") as f:
        return {tuple(r[k] for k in KEY): (int(r["num_samples"]), float(r["accuracy"])) for r in csv.DictReader(f)}


def differences(golden: dict, got: dict) -> list[str]:
    """What keeps `got` from matching `golden` ({key: (num_samples, accuracy)}): missing or extra
    rows, another sample count, or an accuracy more than one sample away."""
    out = [f"not in the golden file: {k}" for k in sorted(got.keys() - golden.keys())]
    out += [f"no longer produced: {k}" for k in sorted(golden.keys() - got.keys())]
    for k in sorted(got.keys() & golden.keys()):
        (n, acc), (n0, acc0) = got[k], golden[k]
        if n != n0 or abs(acc - acc0) > 1 / n + 1e-12:
            out.append(f"{k}: golden {acc0:.6f} of {n0}, now {acc:.6f} of {n}")
    return out


def test_the_comparison_allows_one_sample_and_no_more():
    key = ("fc", "fc", "soup", "2", "", "0", "test", "")
    golden = {key: (200, 0.5)}
    assert differences(golden, {key: (200, 0.5 + 1 / 200)}) == []
    assert differences(golden, {key: (200, 0.5 - 1 / 200)}) == []
    assert len(differences(golden, {key: (200, 0.5 + 2 / 200)})) == 1
    assert len(differences(golden, {key: (201, 0.5)})) == 1
    other = ("fc", "fc", "ensemble", "2", "", "0", "test", "")
    assert differences(golden, {key: (200, 0.5), other: (200, 0.5)}) == [f"not in the golden file: {other}"]
    assert differences(golden, {}) == [f"no longer produced: {key}"]


@pytest.mark.e2e
def test_the_tiny_study_reproduces_the_golden_accuracies(tiny_study):
    if not UPDATE:
        drift = lock_drift_message(LOCK_FILE)
        if drift and os.environ.get("PIPELINE_REQUIRE_LOCKED_ENV") == "1":
            pytest.fail(f"PIPELINE_REQUIRE_LOCKED_ENV=1 but {drift}")
        if drift:
            pytest.skip(f"not the locked environment, golden numbers need not hold: {drift}")
        assert GOLDEN.is_file(), f"{GOLDEN} is missing: run `make golden`"
    rows = accuracy_rows(tiny_study)  # the `.test` study on the CPU, run once per session
    assert_fingerprinted(results_of(tiny_study))
    keys = [key_of(r) for r in rows]
    assert len(keys) == len(set(keys)), "accuracy rows of the tiny study are not unique by " + ", ".join(KEY)
    if UPDATE:
        write_golden(rows)
        return
    got = {key_of(r): (r["num_samples"], r["accuracy"]) for r in rows}
    off = differences(read_golden(), got)
    assert not off, "the tiny study moved from tests/golden/tiny_accuracy.csv (`make golden` if meant):\n" + "\n".join(off)
