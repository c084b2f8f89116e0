"""Claims per regime: the measured distance, the paper's rows at it, and seeds' spread."""
from __future__ import annotations

import csv

import pytest

from pipeline_src.reports.regimes import FAR, NEAR, regime_of_gap
from tests.reports.test_claims import claims_of, row, write_study

T1 = "TAFT-1 within 1 pt of NLFT-1"


def _seeded(full_by_seed: dict[str, list[float]], soups: dict[str, list[float]] | None = None) -> list[dict]:
    out = [row(m, "shard", 1, v, seed=s) for m, vs in full_by_seed.items() for s, v in enumerate(vs)]
    for m, vs in (soups or {}).items():
        out += [row(m, "soup", 10, v, seed=s) for s, v in enumerate(vs)]
    return out


@pytest.mark.parametrize("gap, regime", [(0.1, NEAR), (2.0, NEAR), (5.5, NEAR), (5.6, FAR), (11.7, FAR), (30, FAR)])
def test_the_regime_is_the_paper_group_of_the_nearer_gap_range(gap, regime):
    assert regime_of_gap(gap) == regime  # near: 0.1-1.1 pts, far: 9.9-11.7 pts


def test_a_far_study_quotes_the_papers_far_rows_and_names_where_the_claim_was_made(tmp_path):
    results = write_study(tmp_path, _seeded({"fc": [0.60], "nlft-1": [0.72], "taft-1": [0.64]}))
    claims = claims_of(results, tmp_path / "r")
    t1 = claims[T1]
    assert "FGVC-Aircraft: NLFT-1 69.9, TAFT-1 62.2, FC 58.2 (−7.7 pts)" in t1["paper's rows at this distance"]
    assert "not far" in t1["paper made it for"] and t1["holds"] == "no"
    md = (tmp_path / "r" / "claims.md").read_text()
    assert "Regime (measured distance" in md and "far (NLFT-1 − FC +12.0 pts: nlft-1 − fc)" in md


def test_a_near_study_quotes_the_near_rows(tmp_path):
    results = write_study(tmp_path, _seeded({"fc": [0.80], "nlft-1": [0.805], "taft-1": [0.81]}))
    t1 = claims_of(results, tmp_path / "r")[T1]
    assert t1["paper's rows at this distance"].startswith("Caltech-256, MIT-67, Pets, Dogs, CUB-200: TAFT-1 − NLFT-1")


def test_without_per_image_records_the_point_gap_says_yes_or_no_and_no_test_ran(tmp_path):
    # TAFT-1 − NLFT-1 per seed: -1.5, -0.5, -1.3 pts: mean -1.1 pts; no per-image files
    seeds = {"fc": [0.7, 0.7, 0.7], "nlft-1": [0.800, 0.800, 0.800], "taft-1": [0.785, 0.795, 0.787]}
    claims = claims_of(write_study(tmp_path, _seeded(seeds)), tmp_path / "r")
    assert claims[T1]["holds"] == "no" and claims[T1]["verdict vs the paper's row"] == "no paired test"
    assert claims[T1]["paired test: estimate [95 % interval]"] == ""


def test_searched_methods_show_the_selected_point_only(tmp_path):
    """`metrics_selected`: taft-1's own rows are its selected point's (lr1e-4, chosen on validation;
    its jobs train there, plan/selected_point.py); grid points' test rows (an older layout tested
    them; the other point has the better test accuracy) are left out: the claims and Table 1 show
    taft-1's figure, nothing of the points."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline_src.reports.report import taft_table1
    from pipeline_src.steps.select import SELECTION_SCHEMA, choose
    from pipeline_src.store.results_db import connect

    sel, other = "taft-1_lr1e-4_ptF_clsT", "taft-1_lr1e-3_ptF_clsT"
    rows = _seeded({"fc": [0.70], "nlft-1": [0.80], "taft-1": [0.90]})
    rows += [{**row("taft-1", "shard", 1, 0.85), "method": sel}, {**row("taft-1", "shard", 1, 0.95), "method": other}]
    results = write_study(tmp_path, rows)
    candidates = [{"name": sel, "lr": 1e-4, "pt": False, "cls": True}, {"name": other, "lr": 1e-3, "pt": False, "cls": True}]
    val = [{"method": sel, "shards": 1, "model": "shard", "value": 0.6}, {"method": other, "shards": 1, "model": "shard",
                                                                         "value": 0.5}]
    (results / "select").mkdir()
    pq.write_table(pa.Table.from_pylist(choose(val, candidates, "taft-1", "fake"), schema=SELECTION_SCHEMA),
                   results / "select" / "taft-1.parquet")
    t1 = claims_of(results, tmp_path / "r")[T1]
    assert t1["this study's figure"].startswith("taft-1 90.0 %, nlft-1 80.0 %")
    assert f"selected on validation: taft-1 at N = 1: {sel}: LR 0.0001, PT F, CLS T, val 60.0 %" in t1["note"]
    (tmp_path / "t").mkdir()
    with open(taft_table1(connect(results), tmp_path / "t")[1]) as f:
        table = {r["method"]: float(r["accuracy"]) for r in csv.DictReader(f)}
    assert table == {"fc": 0.70, "nlft-1": 0.80, "taft-1": 0.90}


def test_dp_rows_compare_the_mean_over_noise_draws_per_regime(tmp_path):
    def dp(method, regime, seed, value):
        return row(method, "dp-shard", 1, value, seed=seed,
                   variant={"study": "privacy", "regime": regime, "protocol": "ours", "epsilon": 1.0})

    # full: TAFT − NLFT +1 and −2 pts (mean −0.5): below; fc: +5 and +6 pts
    rows = [dp("taft-1", "full", 0, 0.51), dp("nlft-1", "full", 0, 0.50), dp("taft-1", "full", 1, 0.48),
            dp("nlft-1", "full", 1, 0.50), dp("taft-1", "fc", 0, 0.45), dp("nlft-1", "fc", 0, 0.40),
            dp("taft-1", "fc", 1, 0.46), dp("nlft-1", "fc", 1, 0.40)]
    claim = claims_of(write_study(tmp_path, rows), tmp_path / "r")["DP TAFT ≥ DP NLFT, ε = 1 (ours protocol)"]
    assert claim["holds"] == "no" and "below in full" in claim["note"]
    assert claim["verdict vs the paper's row"] == "no paired test"
    assert "fc: 45.5 % vs 40.0 % (+5.5 pts)" in claim["this study's figure"]
    assert "CUB-200 (near)" in claim["paper made it for"] or "CUB-200" in claim["paper's rows at this distance"]


def test_dp_claims_use_the_pt_the_dp_search_selected(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline_src.steps.select import SELECTION_SCHEMA, choose

    def dp(method, value):
        return {**row("taft-1", "dp-shard", 1, value, variant={"study": "privacy", "regime": "fc", "protocol": "ours",
                                                                "epsilon": 8.0}), "method": method}

    # taft-1 (PT = T) beats NLFT on test, its PT = F point loses; validation chose PT = F
    results = write_study(tmp_path, [dp("taft-1", 0.70), dp("taft-1_dp_ptF", 0.40), dp("nlft-1", 0.50)])
    candidates = [{"name": "taft-1", "lr": 1e-3, "pt": True, "cls": False},
                  {"name": "taft-1_dp_ptF", "lr": 1e-3, "pt": False, "cls": False}]
    val = [{"method": "taft-1", "shards": 1, "model": "dp-shard", "value": 0.5},
           {"method": "taft-1_dp_ptF", "shards": 1, "model": "dp-shard", "value": 0.6}]
    rows = [{**r, "protocol": "ours", "regime": "fc", "epsilon": 8.0} for r in choose(val, candidates, "taft-1", "fake")]
    (results / "select_private").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=SELECTION_SCHEMA), results / "select_private" / "s.parquet")
    claim = claims_of(results, tmp_path / "r")["DP TAFT ≥ DP NLFT, ε = 8 (ours protocol)"]
    assert claim["this study's figure"] == "taft-1 vs nlft-1: fc: 40.0 % vs 50.0 % (-10.0 pts)"
    assert claim["holds"] == "no"
    # Table 3 shows the selected PT's test accuracy under taft-1's name, never the other point's
    from pipeline_src.reports.privacy import privacy_table3
    from pipeline_src.store.results_db import connect

    (tmp_path / "t3").mkdir()
    with open(privacy_table3(connect(results), tmp_path / "t3")[1]) as f:
        table = {r["method"]: float(r["ε=8"]) for r in csv.DictReader(f)}
    assert table == {"nlft-1": 0.50, "taft-1": 0.40}


def test_table1_lists_every_method_in_the_papers_order_with_the_seeds_spread(tmp_path):
    """FC, NLFT, TAFT, full, LAST, then the references that need no pretraining; mean and sample
    sd of the per-seed accuracies."""
    from pipeline_src.reports.report import taft_table1
    from pipeline_src.store.results_db import connect

    rows = _seeded({"taft-1": [0.80, 0.82, 0.84], "last": [0.7, 0.7, 0.7], "fc": [0.6, 0.6, 0.6],
                    "nlft-1": [0.81, 0.81, 0.81]})
    rows += [{**row("scratch", "shard", 1, 0.75), "kind": "full"}, {**row("pixel-logreg", "shard", 1, 0.73),
                                                                   "kind": "baseline", "variant": '{"C": 0.1}'}]
    rows += [{**row("small-cnn", "shard", 1, acc, seed=s), "kind": "baseline", "variant": f'{{"lr": {lr}}}'}
             for s, (acc, lr) in enumerate([(0.78, 0.001), (0.80, 0.0001)])]  # one job per seed, each its own lr
    rows.append(row("taft-1", "soup", 10, 0.5))  # not a full-data model
    (tmp_path / "t").mkdir()
    with open(taft_table1(connect(write_study(tmp_path, rows)), tmp_path / "t")[1]) as f:
        table = list(csv.DictReader(f))
    assert [r["method"] for r in table] == ["fc", "nlft-1", "taft-1", "scratch", "last", "pixel-logreg", "small-cnn"]
    taft = table[2]
    assert float(taft["accuracy"]) == pytest.approx(0.82) and float(taft["sd"]) == pytest.approx(0.02)
    assert taft["seeds"] == "3" and table[-2]["seeds"] == "1" and table[-2]["sd"] == ""
    cnn = table[-1]
    assert cnn["seeds"] == "2" and float(cnn["accuracy"]) == pytest.approx(0.79)
    assert float(cnn["sd"]) == pytest.approx(0.02 ** 0.5 * 0.1)  # sample sd of 0.78, 0.80
