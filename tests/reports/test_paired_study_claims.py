"""The unlearning, DP and fusion claims decided by the paired test over their per-image records
(a hand-made study: metrics and per-image files as the steps write them, read by real DuckDB)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline_src.reports import claim_pairs
from pipeline_src.store.per_image import per_image_rows, write_per_image
from pipeline_src.store.results_db import connect
from tests.reports.test_claims import claims_of, row, write_study

IMAGES, SEEDS = 2000, (0, 1)
SUBTRACT, DP1 = "TAFT subtract ≥ SISA drop, N = 10", "DP TAFT ≥ DP NLFT, ε = 1 (ours protocol)"
FUSION = "Matching before merging raises the soup's accuracy: nlft-1, N = 2, random_reinit"
TEST, VERDICT = "paired test: estimate [95 % interval]", "verdict vs the paper's row"


def images(results: Path, folder: str, method: str, model: str, shards: int, seed: int, variant: dict,
           correct: np.ndarray) -> None:
    """A per-image file of one model, with the context its step writes (`variant` as its metrics')."""
    context = {"experiment": "fake", "method": method, "kind": method.split("-")[0], "model": model,
               "shards": shards, "shard_id": 0 if model == "dp-shard" else None, "seed": seed, "split": "test",
               "variant": json.dumps(variant, sort_keys=True)}
    logits = torch.tensor(np.stack([correct, ~correct], 1).astype(np.float32))  # (images, 2): right when label 0
    rows = per_image_rows(logits, torch.zeros(len(correct), dtype=torch.long),
                          [f"img{i:05d}" for i in range(len(correct))], context)
    files = len(list((results / "per_image").rglob("*.parquet"))) if (results / "per_image").exists() else 0
    write_per_image(rows, results / "per_image" / folder / method / f"{model}_s{seed}_{files}.parquet")


def correct_at(accuracy: float, seed: int, salt: int) -> np.ndarray:
    """A correctness vector of exactly round(accuracy · IMAGES) right images, drawn per seed and salt."""
    order = np.random.default_rng(1000 * seed + salt).permutation(IMAGES)
    out = np.zeros(IMAGES, dtype=bool)
    out[order[: round(accuracy * IMAGES)]] = True
    return out


def study(tmp_path: Path, subtract: dict, sisa: dict, dp: dict, fusion: dict) -> tuple[Path, dict]:
    """Two seeds; per model a correctness vector at the given accuracy, its metrics row their mean
    and its per-image file the vector. Returns the results folder and the vectors by model and seed.

    Args:
        subtract, sisa: removed-shard count r -> accuracy (one request per r, N = 10).
        dp: (method, regime) -> accuracy of its DP model at N = 1, protocol ours, ε = 1.
        fusion: matching -> accuracy of nlft-1's fusion soup, N = 2, random_reinit.
    """
    models = []  # (vector key, folder, method, model, N, variant)
    for method, model, points in (("taft-1", "subtract", subtract), ("nlft-1", "sisa-drop", sisa)):
        models += [((model, r), "unlearn_drop", method, model, 10, {"strategy": model, "removed_shards": r, "request": 0},
                    acc) for r, acc in points.items()]
    models += [((method, regime), "private", method, "dp-shard", 1,
                {"study": "privacy", "regime": regime, "protocol": "ours", "epsilon": 1.0}, acc)
               for (method, regime), acc in dp.items()]
    models += [((matching,), "fuse", "nlft-1", "fusion-soup", 2,
                {"study": "fusion", "init": "random_reinit", "matching": matching}, acc) for matching, acc in fusion.items()]
    vectors, rows = {}, []
    for seed in SEEDS:
        for salt, (key, _, method, model, n, variant, acc) in enumerate(models):
            vectors[(*key, seed)] = v = correct_at(acc, seed, salt)
            rows.append(row(method, model, n, float(v.mean()), variant=variant, seed=seed))
    results = write_study(tmp_path, rows)
    for seed in SEEDS:
        for key, folder, method, model, n, variant, _ in models:
            images(results, folder, method, model, n, seed, variant, vectors[(*key, seed)])
    return results, vectors


def test_study_claims_get_an_estimate_an_interval_and_a_verdict(tmp_path):
    results, v = study(tmp_path, subtract={0: 0.9, 1: 0.80, 2: 0.70}, sisa={0: 0.95, 1: 0.70, 2: 0.60},
                       dp={("taft-1", "full"): 0.60, ("nlft-1", "full"): 0.50, ("taft-1", "fc"): 0.45,
                           ("nlft-1", "fc"): 0.40},
                       fusion={"none": 0.50, "rotation-scaling": 0.60})
    claims = claims_of(results, tmp_path / "r")
    for name, estimate in ((SUBTRACT, "+10.0 pts"), (DP1, "+7.5 pts"), (FUSION, "+10.0 pts")):
        c = claims[name]
        assert c[TEST].startswith(f"{estimate} [") and "paired bootstrap over 2 seeds and 2000 test images" in c[TEST], c
        assert (c["holds"], c[VERDICT]) == ("yes", "agrees"), c
    assert "the mean over r = 1, 2" in claims[SUBTRACT][TEST]  # r = 0 removes nothing: left out
    assert "paired per r: r = 1: +10.0 pts [" in claims[SUBTRACT]["note"]
    assert "paired per regime: regime = fc: +5.0 pts [" in claims[DP1]["note"]
    md = (tmp_path / "r" / "claims.md").read_text()
    assert "agrees 3, disagrees 0, undecided 0" in md and "no paired test 0" in md


def test_a_gap_inside_the_noise_is_undecided_and_one_below_disagrees(tmp_path):
    # fusion: matching +0.1 pt (2 images of 2,000) is inside the interval; DP: TAFT 10 pts below in both regimes
    results, _ = study(tmp_path, subtract={1: 0.70}, sisa={1: 0.80},
                       dp={("taft-1", "full"): 0.40, ("nlft-1", "full"): 0.50, ("taft-1", "fc"): 0.30,
                           ("nlft-1", "fc"): 0.40},
                       fusion={"none": 0.500, "rotation-scaling": 0.501})
    claims = claims_of(results, tmp_path / "r")
    assert (claims[FUSION]["holds"], claims[FUSION][VERDICT]) == ("undecided", "undecided")
    assert (claims[DP1]["holds"], claims[DP1][VERDICT]) == ("no", "disagrees")
    assert (claims[SUBTRACT]["holds"], claims[SUBTRACT][VERDICT]) == ("no", "disagrees")


def test_the_pairs_are_the_per_image_differences_averaged_over_the_cases(tmp_path):
    """claim_pairs' SQL against the same differences computed directly from the vectors (values
    k/2 and their means: exact in float64, so compared exactly)."""
    results, v = study(tmp_path, subtract={1: 0.8, 2: 0.7}, sisa={1: 0.75, 2: 0.72},
                       dp={("taft-1", "full"): 0.6, ("nlft-1", "full"): 0.55, ("taft-1", "fc"): 0.5,
                           ("nlft-1", "fc"): 0.45}, fusion={"none": 0.5, "rotation": 0.55})
    con = connect(results)
    got = claim_pairs.seed_differences(claim_pairs.drop_pairs(con, "taft-1", "nlft-1", 10))
    for seed, d in zip(SEEDS, got):
        want = np.mean([v["subtract", r, seed].astype(int) - v["sisa-drop", r, seed].astype(int) for r in (1, 2)], 0)
        np.testing.assert_array_equal(d, want)  # sample ids sort as the vectors' indices
    got = claim_pairs.seed_differences(claim_pairs.dp_pairs(con, "taft-1", "nlft-1", "ours", 1.0))
    for seed, d in zip(SEEDS, got):
        want = np.mean([v["taft-1", r, seed].astype(int) - v["nlft-1", r, seed].astype(int) for r in ("fc", "full")], 0)
        np.testing.assert_array_equal(d, want)
    got = claim_pairs.seed_differences(claim_pairs.fusion_pairs(con, "nlft-1", 2, "random_reinit", "rotation"))
    assert [d.tolist() for d in got] == [(v["rotation", s].astype(int) - v["none", s].astype(int)).tolist() for s in SEEDS]
    assert claim_pairs.fusion_pairs(con, "nlft-1", 2, "random_reinit", "rotation-scaling").empty


def test_an_image_missing_a_case_is_refused():
    import pandas as pd

    pairs = pd.DataFrame({"seed": [0, 0, 0], "case": [1, 2, 1], "sample_id": ["a", "a", "b"], "d": [1, 0, -1]})
    with pytest.raises(ValueError, match="seed 0: 1 image"):
        claim_pairs.seed_differences(pairs)


def test_dp_pairs_take_the_point_the_dp_search_selected(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline_src.steps.select import SELECTION_SCHEMA, choose

    results, v = study(tmp_path, subtract={}, sisa={}, fusion={},
                       dp={("taft-1", "fc"): 0.70, ("taft-1_dp_ptF", "fc"): 0.40, ("nlft-1", "fc"): 0.50})
    candidates = [{"name": "taft-1", "lr": 1e-3, "pt": True, "cls": False},
                  {"name": "taft-1_dp_ptF", "lr": 1e-3, "pt": False, "cls": False}]
    val = [{"method": "taft-1", "shards": 1, "model": "dp-shard", "value": 0.5},
           {"method": "taft-1_dp_ptF", "shards": 1, "model": "dp-shard", "value": 0.6}]
    rows = [{**r, "protocol": "ours", "regime": "fc", "epsilon": 1.0} for r in choose(val, candidates, "taft-1", "fake")]
    (results / "select_private").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=SELECTION_SCHEMA), results / "select_private" / "s.parquet")
    claim = claims_of(results, tmp_path / "r")[DP1]
    # validation chose PT = F (40 %): the paired test compares it, under taft-1's name, with NLFT's 50 %
    assert claim[TEST].startswith("-10.0 pts [") and claim["holds"] == "no", claim
