"""The premise rows (`reports/testbed_claims.py`): fine-tuned models against every no-pretraining
reference, decided by the paired bootstrap over seeds and test images (a hand-made study: metrics,
per-image and selection files as the steps write them, read by real DuckDB)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline_src.reports.testbed_claims import BEST_ROW, FC_ROW, premise_rows
from pipeline_src.steps.select import SELECTION_SCHEMA, choose
from pipeline_src.store.per_image import prediction_rows, write_per_image
from pipeline_src.store.results_db import connect
from tests.reports.test_claims import claims_of, row, write_study

IMAGES, SEEDS = 3000, (0, 1)
METHODS = {"fc": {"kind": "fc"}, "nlft-1": {"kind": "nlft", "k": 1}, "full": {"kind": "full"},
           "scratch": {"kind": "full", "init": "random"}}
CONFIG = {"experiment": "fake", "methods": METHODS, "dataset": {}, "backbone": {}, "train": {}, "shards": [1],
          "seeds": list(SEEDS)}


def correct_at(accuracy: float, seed: int, salt: int) -> np.ndarray:
    """Exactly round(accuracy · IMAGES) right images, drawn per seed and salt."""
    out = np.zeros(IMAGES, dtype=bool)
    out[np.random.default_rng(100 * seed + salt).permutation(IMAGES)[: round(accuracy * IMAGES)]] = True
    return out


def study(tmp_path: Path, accuracy: dict[str, float], seeds: dict[str, tuple[int, ...]] | None = None,
          val: dict[str, float] | None = None) -> tuple[Path, dict]:
    """Full-data models (N = 1) at the given test accuracies, per seed; the baselines (names
    starting `pixel` or `small`) with kind `baseline` and a variant, as their steps write them.

    Args:
        accuracy: method -> test accuracy of each seed's model.
        seeds: method -> its seeds (default both).
        val: method -> the validation accuracy of its selected point at N = 1 (a `selection` file each).
    """
    vectors, rows = {}, []
    for salt, (method, acc) in enumerate(accuracy.items()):
        baseline = method.startswith(("pixel", "small"))
        for seed in (seeds or {}).get(method, SEEDS):
            vectors[method, seed] = v = correct_at(acc, seed, salt)
            rows.append(row(method, "shard", 1, float(v.mean()), seed=seed) | ({"kind": "baseline"} if baseline else {}))
    results = write_study(tmp_path, rows)
    for (method, seed), v in vectors.items():
        baseline = method.startswith(("pixel", "small"))
        context = {"experiment": "fake", "method": method, "kind": "baseline" if baseline else METHODS[method]["kind"],
                   "model": "shard", "shards": 1, "shard_id": 0, "seed": seed, "split": "test",
                   "variant": json.dumps({"C": 0.1}) if baseline else None}
        labels = torch.zeros(IMAGES, dtype=torch.long)
        write_per_image(prediction_rows(torch.tensor((~v).astype(np.int64)), labels,
                                        [f"img{i:05d}" for i in range(IMAGES)], context),
                        results / "per_image" / method / f"s{seed}.parquet")
    for method, value in (val or {}).items():
        cand = [{"name": f"{method}_lr1e-3", "lr": 1e-3}, {"name": f"{method}_lr1e-4", "lr": 1e-4}]
        rows = [{"method": c["name"], "shards": 1, "model": "shard", "value": value - 0.05 * i} for i, c in enumerate(cand)]
        (results / "select").mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(choose(rows, cand, method, "fake"), schema=SELECTION_SCHEMA),
                       results / "select" / f"{method}.parquet")
    return results, vectors


def gap(vectors: dict, t: str, r: str) -> float:
    """The mean over t's seeds of t − r on the same images; a one-seed r pairs with every seed."""
    r_seeds = sorted(s for m, s in vectors if m == r)
    return float(np.mean([vectors[t, s].mean() - vectors[r, s if len(r_seeds) > 1 else r_seeds[0]].mean()
                          for s in SEEDS]))


def test_fc_is_paired_with_each_reference_and_the_closest_one_is_the_test(tmp_path):
    """The pixel reference ran once (deterministic) and pairs with both seeds of fc; the test
    column is the closest reference's; every reference's interval is in the note."""
    results, v = study(tmp_path, {"fc": 0.86, "pixel-logreg": 0.74, "small-cnn": 0.80, "scratch": 0.70},
                       seeds={"pixel-logreg": (0,)}, val={"fc": 0.85, "nlft-1": 0.9})
    claims = claims_of(results, tmp_path / "r", CONFIG)
    fc = claims[FC_ROW]
    # a check of the testbed, no paper's claim: out of the agrees / disagrees tally
    assert fc["holds"] == "yes" and fc["verdict vs the paper's row"] == "testbed premise"
    md = (tmp_path / "r" / "claims.md").read_text()
    assert "agrees 0, disagrees 0, undecided 0. Not in the tally: testbed premise 1," in md  # the best row: n/a
    closest = gap(v, "fc", "small-cnn")
    assert abs(closest - 0.06) < 0.02
    assert fc["this study's figure"].startswith(f"fc − small-cnn (the closest reference) {100 * closest:+.1f} pts [")
    assert "paired bootstrap over 2 seeds and 3000 test images" in fc["paired test: estimate [95 % interval]"]
    for ref in ("pixel-logreg", "small-cnn", "scratch"):
        assert f"{ref}: {100 * gap(v, 'fc', ref):+.1f} pts [" in fc["note"], ref
    assert list(claims)[:2] == [FC_ROW, BEST_ROW]  # the premise first
    assert claims[BEST_ROW]["holds"] == "n/a" and "nlft-1 (N = 1)" in claims[BEST_ROW]["this study's figure"]


def test_one_reference_above_says_no_and_a_close_one_undecided(tmp_path):
    results, _ = study(tmp_path, {"fc": 0.80, "pixel-logreg": 0.70, "small-cnn": 0.85, "scratch": 0.70})
    assert premise_rows(connect(results), METHODS)[0]["holds"] == "no"
    results, _ = study(tmp_path / "close", {"fc": 0.800, "pixel-logreg": 0.70, "small-cnn": 0.799})
    assert premise_rows(connect(results), METHODS)[0]["holds"] == "undecided"


def test_the_best_method_is_chosen_on_validation_never_on_test_nor_among_references(tmp_path):
    """full has the best selected val point (scratch's is higher but it is a reference); nlft-1 the
    best test accuracy, and is not the one tested."""
    results, v = study(tmp_path, {"fc": 0.70, "nlft-1": 0.90, "full": 0.78, "small-cnn": 0.75, "scratch": 0.60},
                       val={"fc": 0.70, "nlft-1": 0.80, "full": 0.85, "scratch": 0.95})
    rows = {r["claim"]: r for r in premise_rows(connect(results), METHODS)}
    assert list(rows) == [FC_ROW, BEST_ROW]
    assert rows[FC_ROW]["holds"] == "no"
    best = rows[BEST_ROW]
    assert best["holds"] == "yes" and "best selected point on validation at N = 1 (85.0 %)" in best["note"]
    assert f"full − small-cnn (the closest reference) {100 * gap(v, 'full', 'small-cnn'):+.1f} pts" in best["study_figure"]


def test_without_a_search_or_a_reference_the_rows_say_what_is_missing(tmp_path):
    results, _ = study(tmp_path, {"fc": 0.80, "small-cnn": 0.70})
    rows = premise_rows(connect(results), METHODS)
    assert rows[0]["holds"] == "yes" and rows[1]["holds"] == "n/a" and "search.enabled" in rows[1]["study_figure"]
    results, _ = study(tmp_path / "none", {"fc": 0.80, "nlft-1": 0.85})
    (only,) = premise_rows(connect(results), {m: c for m, c in METHODS.items() if m != "scratch"})
    assert only["holds"] == "n/a" and "baselines.small_cnn" in only["study_figure"]


def test_the_search_grid_points_of_a_scratch_reference_are_not_references(tmp_path):
    """A searched `init: random` method's grid points (`scratch_lr1e-3`, in the config's methods
    once the search adds them) exist for the search only: the reference is the selected `scratch`."""
    results, _ = study(tmp_path, {"fc": 0.86, "small-cnn": 0.80, "scratch": 0.70}, val={"fc": 0.85, "scratch": 0.7})
    methods = METHODS | {f"scratch_lr1e-{e}": {"kind": "full", "init": "random", "lr": 10.0 ** -e} for e in (3, 4)}
    fc = premise_rows(connect(results), methods)[0]
    assert "no shared records" not in fc["note"]
    assert [part.split(":")[0] for part in fc["note"].split("paired per test image: ")[1].split("; ")] == \
        ["small-cnn", "scratch"]
    # a reference that the search did not produce and that has no records is still named as missing
    fc = premise_rows(connect(results), methods | {"scratch-wide": {"kind": "full", "init": "random"}})[0]
    assert fc["note"].endswith("no shared records with scratch-wide")
