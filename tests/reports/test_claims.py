"""The claims table on hand-made metrics files (written by the project's metrics writer, read by
real DuckDB views): which rows each claim compares, and yes / no / n/a."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from pipeline_src.reports.claims import claims_report
from pipeline_src.reports.report import REPORTS, WITH_CONFIG
from pipeline_src.store.metrics import SCHEMA_VERSION, write_metrics
from pipeline_src.store.results_db import connect

# Config order matters: taft-1 is the first taft method with k = 1, and taft-1-b (a worse
# model) must never stand in for it; taft-4 / nlft-4 (k = 4) are never the TAFT pair.
METHODS = {
    "fc": {"kind": "fc"}, "taft-1": {"kind": "taft", "k": 1}, "nlft-1": {"kind": "nlft", "k": 1},
    "taft-1-b": {"kind": "taft", "k": 1}, "taft-4": {"kind": "taft", "k": 4}, "nlft-4": {"kind": "nlft", "k": 4},
    "full": {"kind": "full"}, "last": {"kind": "last", "rank": 8, "heads": 2}, "taft-0": {"kind": "taft", "k": 1},
}
CONFIG = {"experiment": "fake", "methods": METHODS, "dataset": {"source": "digits", "img_size": 8},
          "backbone": {"source": "pretrain", "arch": {"depth": 2}}, "train": {"epochs": 2}, "shards": [1, 2, 10],
          "seeds": [0], "device": "cpu"}


PREMISE_UNTESTED = "Pretraining is worth it: fine-tuned models above every no-pretraining reference"


def row(method: str, model: str, shards: int, value: float, metric: str = "accuracy", variant: dict | None = None,
        seed: int = 0) -> dict:
    """One metrics row of the schema (the identifying columns a step would write)."""
    return {"schema_version": SCHEMA_VERSION, "experiment": "fake", "dataset": "digits", "method": method,
            "kind": METHODS[method]["kind"] if method in METHODS else method, "model": model,
            "variant": json.dumps(variant, sort_keys=True) if variant else None, "shards": shards,
            "shard_id": 0 if model in ("shard", "dp-shard") else None, "seed": seed, "split": "test",
            "metric": metric, "value": value, "num_samples": 100, "wall_time_s": 1.0, "peak_mem_mb": 300.0,
            "device": "cpu"}


def record(results: Path, method: str, peak_mem_mb: float | None, device: str = "cpu") -> None:
    """The JSON record of a method's full-data model, as `steps/train.py` writes it."""
    path = results / "train" / method / "n1_s0" / "shard0.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"kind": "trained", "method": method, "method_config": METHODS[method], "shards": 1, "shard_id": 0,
           "seed": 0, "device": device, "wall_time_s": 1.0, "sample_ids": ["a", "b"]}
    if peak_mem_mb is not None:
        rec["peak_mem_mb"] = peak_mem_mb
    path.write_text(json.dumps(rec))


def accuracy_rows(full: dict[str, float], soups: dict[tuple[str, int], float]) -> list[dict]:
    return ([row(m, "shard", 1, v) for m, v in full.items()]
            + [row(m, "soup", n, v) for (m, n), v in soups.items()])


def drop_rows(taft: dict[int, list[float]], sisa: dict[int, list[float]], n: int = 10) -> list[dict]:
    """Per removed-shard count r, one accuracy per request (r = 0: nothing removed)."""
    out = []
    for method, model, points in (("taft-1", "subtract", taft), ("nlft-1", "sisa-drop", sisa)):
        for r, values in points.items():
            out += [row(method, model, n, v, variant={"strategy": model, "removed_shards": r, "request": q})
                    for q, v in enumerate(values)]
    return out


def dp_rows(points: dict[tuple[str, str, str, float], float]) -> list[dict]:
    """(method, regime, protocol, ε) -> accuracy of the DP model at N = 1."""
    return [row(m, "dp-shard", 1, v, variant={"study": "privacy", "regime": r, "protocol": p, "epsilon": e})
            for (m, r, p, e), v in points.items()]


def fusion_rows(points: dict[str, float], method: str = "nlft-1", n: int = 2) -> list[dict]:
    """matching -> accuracy of the fusion study's soup."""
    return [row(method, "fusion-soup", n, v, variant={"study": "fusion", "init": "random_reinit", "matching": m})
            for m, v in points.items()]


def retrain_rows(method: str, n: int, requests: list[tuple[float, int, float]], paragon_s: float) -> list[dict]:
    """Per request (fraction, affected shards, retrain-shard seconds): its rows and the paragon's."""
    out = []
    for q, (fraction, affected, seconds) in enumerate(requests):
        v = {"strategy": "retrain-shard", "fraction": fraction, "request": q}
        out += [row(method, "retrain-shard", n, 0.5, variant=v), row(method, "retrain-shard", n, seconds,
                "unlearn_time_s", v), row(method, "retrain-shard", n, affected, "affected_shards", v)]
        p = {"strategy": "paragon", "fraction": fraction, "request": q}
        out += [row(method, "paragon", 1, 0.6, variant=p), row(method, "paragon", 1, paragon_s, "unlearn_time_s", p)]
        # the paper's non-linear paragon is a different comparison: never read by this claim
        out.append(row(method, "paragon-nonlinear", 1, paragon_s * 100, "unlearn_time_s",
                       {"strategy": "paragon-nonlinear", "fraction": fraction, "request": q}))
    return out


def write_study(tmp_path: Path, rows: list[dict], memory: dict[str, float | None] | None = None) -> Path:
    results = tmp_path / "results"
    write_metrics([row("fc", "backbone", 1, 0.99) | {"kind": "pretrain", "method": "pretrain"}] + rows,
                  results / "metrics" / "fake.parquet")
    for method, mb in (memory or {}).items():
        record(results, method, mb)
    return results


def claims_of(results: Path, out: Path, config: dict | None = CONFIG) -> dict[str, dict]:
    out.mkdir(exist_ok=True)
    md, csv_path = claims_report(connect(results), out, config)
    assert md.name == "claims.md" and md.read_text().startswith("# Claims")
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["claim", "paper", "paper table/figure", "paper's figure", "paper made it for",
                             "paper's rows at this distance", "this study's figure",
                             "paired test: estimate [95 % interval]", "holds", "verdict vs the paper's row", "note"]
    return {r["claim"]: r for r in rows}


def holds(claims: dict[str, dict]) -> dict[str, str]:
    return {name: c["holds"] for name, c in claims.items()}


FULL = {"fc": 0.70, "taft-1": 0.80, "nlft-1": 0.805, "taft-1-b": 0.50, "taft-4": 0.9, "nlft-4": 0.6, "full": 0.95,
        "last": 0.75}


def supporting_study(tmp_path: Path) -> Path:
    """A study where every claim holds (and picking the wrong rows would break some)."""
    return write_study(tmp_path, [
        *accuracy_rows(FULL, {("taft-1", 2): 0.78, ("nlft-1", 2): 0.70, ("taft-1", 10): 0.75, ("nlft-1", 10): 0.65,
                              ("taft-1-b", 2): 0.1, ("taft-4", 10): 0.1, ("nlft-4", 10): 0.9}),
        # r = 0 (nothing removed) would fail the claim: it is not a forgetting point
        *drop_rows({0: [0.90], 1: [0.8, 0.7], 2: [0.6, 0.6]}, {0: [0.95], 1: [0.7, 0.6], 2: [0.55, 0.55]}),
        *dp_rows({("taft-1", "full", "ours", 1.0): 0.6, ("nlft-1", "full", "ours", 1.0): 0.5,
                  ("taft-1", "fc", "ours", 1.0): 0.4, ("nlft-1", "fc", "ours", 1.0): 0.4,
                  ("taft-1", "full", "ours", 8.0): 0.7, ("nlft-1", "full", "ours", 8.0): 0.65,
                  ("taft-1-b", "full", "ours", 8.0): 0.1}),
        *fusion_rows({"none": 0.5, "permutation": 0.4, "rotation-scaling": 0.6}),
        # one request touching one shard (the claim's) and one touching all 10 (left out)
        *retrain_rows("taft-1", 10, [(0.001, 1, 1.0), (0.1, 10, 9.0)], paragon_s=8.0),
    ], memory={"last": 200.0, "full": 1000.0, "fc": 150.0})


def test_every_claim_holds_where_the_study_supports_it(tmp_path):
    claims = claims_of(supporting_study(tmp_path), tmp_path / "report")
    assert holds(claims) == {
        PREMISE_UNTESTED: "n/a",  # no no-pretraining reference here: tests/reports/test_testbed_claims.py
        "TAFT-1 within 1 pt of NLFT-1": "yes",
        "TAFT composition (Δw sum) ≥ non-linear soup, N = 2": "yes",
        "TAFT composition (Δw sum) ≥ non-linear soup, N = 10": "yes",
        "TAFT subtract ≥ SISA drop, N = 10": "yes",
        "DP TAFT ≥ DP NLFT, ε = 1 (ours protocol)": "yes",
        "DP TAFT ≥ DP NLFT, ε = 8 (ours protocol)": "yes",
        "Matching before merging raises the soup's accuracy: nlft-1, N = 2, random_reinit": "yes",
        "LAST ≥ FC at ≤ 25 % of full fine-tuning's memory": "yes",
        "Unlearning cost: retrain-shard ≈ N× cheaper than the paragon: taft-1, N = 10": "yes",
    }
    fig = {name: c["this study's figure"] for name, c in claims.items()}
    assert fig["TAFT-1 within 1 pt of NLFT-1"] == "taft-1 80.0 %, nlft-1 80.5 % (-0.5 pts)"
    assert fig["TAFT composition (Δw sum) ≥ non-linear soup, N = 10"] == \
        "taft-1 Δw sum 75.0 %, nlft-1 soup 65.0 % (+10.0 pts)"
    assert fig["TAFT subtract ≥ SISA drop, N = 10"] == \
        "taft-1 subtract 67.5 %, nlft-1 SISA drop 60.0 % (+7.5 pts, mean over r = 1, 2)"
    assert fig["DP TAFT ≥ DP NLFT, ε = 1 (ours protocol)"] == \
        "taft-1 vs nlft-1: fc: 40.0 % vs 40.0 % (+0.0 pts); full: 60.0 % vs 50.0 % (+10.0 pts)"
    assert fig["Matching before merging raises the soup's accuracy: nlft-1, N = 2, random_reinit"] == \
        "rotation-scaling 60.0 %, none 50.0 % (+10.0 pts)"
    assert fig["LAST ≥ FC at ≤ 25 % of full fine-tuning's memory"] == \
        "last 75.0 %, fc 70.0 % (+5.0 pts); memory 200 MB = 20 % of full's 1000 MB"
    # speed-up over the single-shard request only: 8 s / 1 s (not (8 + 8) / (1 + 9))
    assert fig["Unlearning cost: retrain-shard ≈ N× cheaper than the paragon: taft-1, N = 10"] == \
        "8.0× (1.00 s vs paragon 8.00 s)"
    paper = {name: c["paper's figure"] for name, c in claims.items()}
    assert paper["TAFT composition (Δw sum) ≥ non-linear soup, N = 10"] == \
        "+9 to +13.5 pts over the non-linear soup at N = 10–50"
    assert paper["TAFT composition (Δw sum) ≥ non-linear soup, N = 2"].startswith("not reported at N = 2")
    md = (tmp_path / "report" / "claims.md").read_text()
    assert "Holds: yes 9, no 0, undecided 0, n/a 1" in md and "Study: experiment `fake`" in md and "## Rows compared" in md


def test_claims_that_the_study_contradicts_say_no(tmp_path):
    full = FULL | {"taft-1": 0.79, "last": 0.65}  # taft-1 1.5 pts below nlft-1; last below fc
    results = write_study(tmp_path, [
        *accuracy_rows(full, {("taft-1", 10): 0.60, ("nlft-1", 10): 0.65}),
        *drop_rows({1: [0.8], 2: [0.5]}, {1: [0.7], 2: [0.55]}),  # above at r = 1, below at r = 2
        *dp_rows({("taft-1", "full", "ours", 3.0): 0.6, ("nlft-1", "full", "ours", 3.0): 0.5,
                  ("taft-1", "fc", "ours", 3.0): 0.3, ("nlft-1", "fc", "ours", 3.0): 0.4}),
        *fusion_rows({"none": 0.5, "rotation": 0.5}),  # equal: matching did not raise the soup
        *retrain_rows("nlft-1", 10, [(0.001, 1, 2.0)], paragon_s=8.0),  # 4× < N / 2
    ], memory={"last": 300.0, "full": 1000.0})
    claims = claims_of(results, tmp_path / "report")
    assert claims.pop(PREMISE_UNTESTED)["holds"] == "n/a"  # no reference ran: tests/reports/test_testbed_claims.py
    assert set(holds(claims).values()) == {"no"}, holds(claims)
    assert "below at r = 2" in claims["TAFT subtract ≥ SISA drop, N = 10"]["note"]
    assert "below in fc" in claims["DP TAFT ≥ DP NLFT, ε = 3 (ours protocol)"]["note"]
    assert claims["Matching before merging raises the soup's accuracy: nlft-1, N = 2, random_reinit"][
        "this study's figure"] == "rotation 50.0 %, none 50.0 % (+0.0 pts)"
    assert claims["LAST ≥ FC at ≤ 25 % of full fine-tuning's memory"]["this study's figure"].endswith(
        "memory 300 MB = 30 % of full's 1000 MB")


def test_exactly_one_point_below_still_holds(tmp_path):
    results = write_study(tmp_path, accuracy_rows({"taft-1": 0.795, "nlft-1": 0.805}, {}))
    assert claims_of(results, tmp_path / "report")["TAFT-1 within 1 pt of NLFT-1"]["holds"] == "yes"


def test_claims_the_study_did_not_run_are_not_applicable_and_say_why(tmp_path):
    claims = claims_of(write_study(tmp_path, []), tmp_path / "report")  # only the pretrain row
    assert set(holds(claims).values()) == {"n/a"}
    why = {name: c["this study's figure"] for name, c in claims.items()}
    assert why["TAFT-1 within 1 pt of NLFT-1"] == \
        "— no taft method with k = 1 has a full-data (N = 1) model and no nlft method with k = 1 has a full-data " \
        "(N = 1) model"
    assert "privacy.enabled" in why["DP TAFT ≥ DP NLFT"]
    assert "fusion.enabled" in why["Matching before merging raises the soup's accuracy"]
    assert "forget.study" in why["Unlearning cost: retrain-shard ≈ N× cheaper than the paragon"]
    assert "forget.study" in why["TAFT subtract ≥ SISA drop"]


def test_partly_run_claims_name_the_missing_jobs(tmp_path):
    results = write_study(tmp_path, [
        *accuracy_rows({m: FULL[m] for m in ("fc", "taft-1", "nlft-1", "last")},
                       {("taft-1", 2): 0.7, ("taft-1", 10): 0.7, ("nlft-1", 10): 0.6}),
        *dp_rows({("taft-1", "fc", "paper", 8.0): 0.5}),  # the paper protocol ran for taft only
        *fusion_rows({"none": 0.5, "permutation": 0.6}),  # no rotation matching
        *retrain_rows("taft-1", 3, [(0.01, 3, 1.0)], paragon_s=2.0),  # every request touched all 3 shards
    ], memory={"last": 200.0})
    why = {name: (c["holds"], c["this study's figure"]) for name, c in claims_of(results, tmp_path / "r").items()}
    assert why["TAFT composition (Δw sum) ≥ non-linear soup, N = 2"] == ("n/a", "— no soup of nlft-1 at N = 2")
    assert why["TAFT composition (Δw sum) ≥ non-linear soup, N = 10"][0] == "yes"
    assert why["DP TAFT ≥ DP NLFT, ε = 8 (paper protocol)"] == (
        "n/a", "— no nlft method with k = 1: no DP model under the paper protocol at ε = 8")
    assert why["Matching before merging raises the soup's accuracy: nlft-1, N = 2, random_reinit"] == (
        "n/a", "— no soup after rotation matching (fusion.matching)")
    assert why["LAST ≥ FC at ≤ 25 % of full fine-tuning's memory"] == (
        "n/a", "— no full method trained at N = 1; accuracy: last 75.0 %, fc 70.0 % (+5.0 pts)")
    assert why["Unlearning cost: retrain-shard ≈ N× cheaper than the paragon: taft-1, N = 3"] == (
        "n/a", "— no request touched a single shard (fewest: 3 of 3; add 0, single-sample requests, to "
        "forget.study.forget_fractions)")


def test_memory_needs_records_that_carry_it(tmp_path):
    results = write_study(tmp_path, accuracy_rows(FULL, {}), memory={"last": 200.0, "full": None})
    claim = claims_of(results, tmp_path / "report")["LAST ≥ FC at ≤ 25 % of full fine-tuning's memory"]
    assert claim["holds"] == "n/a" and "no peak_mem_mb in the N = 1 train records of full" in claim[
        "this study's figure"]


@pytest.mark.parametrize("config, expected", [(CONFIG, "yes"), (None, "no")])
def test_the_first_method_of_the_config_not_of_the_name_order(tmp_path, config, expected):
    """taft-0 (a worse model) comes last in the config but first by name: without a config the
    claims fall back on the trained records, in name order."""
    results = write_study(tmp_path, accuracy_rows({"taft-1": 0.80, "nlft-1": 0.80, "taft-0": 0.5}, {}))
    for m in ("taft-1", "nlft-1", "taft-0"):
        record(results, m, 100.0)
    assert claims_of(results, tmp_path / "report", config)["TAFT-1 within 1 pt of NLFT-1"]["holds"] == expected


def test_the_report_step_gives_the_claims_the_config():
    assert "claims" in REPORTS and WITH_CONFIG <= set(REPORTS)


@pytest.mark.parametrize("test_limit, shown", [("same", None), (None, "test_limit_per_class null (every test image)"),
                                               (1000, "test_limit_per_class 1000")])
def test_the_settings_line_says_how_many_test_images(test_limit, shown):
    """issue 42 §1: a study testing on every image says so; the default (`same`) adds nothing."""
    from pipeline_src.reports.claims import study_settings

    line = study_settings({"experiment": "x", "dataset": {"source": "idx", "limit_per_class": 300,
                                                          "test_limit_per_class": test_limit}})
    assert "limit_per_class 300" in line
    assert (shown in line) if shown else "test_limit" not in line
