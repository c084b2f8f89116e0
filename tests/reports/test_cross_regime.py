"""The cross-regime claims table: two studies' results folders, a column each, nearest first."""
from __future__ import annotations

import csv

import pytest

from pipeline_src.reports.cross_regime import bare_claim, main, rows_by_setting
from tests.reports.test_claims import record, row, write_study


def _study(tmp_path, name, fc, nlft, taft, soups=None):
    rows = [row("fc", "shard", 1, fc), row("nlft-1", "shard", 1, nlft), row("taft-1", "shard", 1, taft)]
    rows += [row(m, "soup", 10, acc) for m, acc in (soups or {}).items()]
    results = write_study(tmp_path / name, [{**r, "experiment": name} for r in rows])
    for m in ("fc", "nlft-1", "taft-1"):
        record(results, m, 100.0)
    return results


def test_one_table_with_a_column_per_regime_ordered_by_distance(tmp_path, capsys):
    far = _study(tmp_path, "far-study", 0.58, 0.70, 0.62)  # NLFT-1 − FC 12 pts
    near = _study(tmp_path, "near-study", 0.80, 0.805, 0.81)  # 0.5 pts
    assert main([str(far), str(near), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "claims_by_regime.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| claim"))
    assert header.index("near-study: near") < header.index("far-study: far")  # nearest first
    t1 = next(line for line in md.splitlines() if line.startswith("| TAFT-1 within 1 pt of NLFT-1"))
    assert "**yes**: taft-1 81.0 %" in t1 and "**no**: taft-1 62.0 %" in t1
    assert "FGVC-Aircraft: NLFT-1 69.9, TAFT-1 62.2, FC 58.2" in md and "Caltech-256, MIT-67" in md
    with open(tmp_path / "out" / "claims_by_regime.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["claim"] == "TAFT-1 within 1 pt of NLFT-1"]
    assert [(r["study"], r["regime"], r["holds"]) for r in rows] == [("near-study", "near", "yes"),
                                                                    ("far-study", "far", "no")]
    assert float(rows[1]["nlft1_minus_fc_pts"]) == pytest.approx(12.0)


def test_fewer_than_two_studies_or_a_folder_without_metrics_is_refused(tmp_path, capsys):
    one = _study(tmp_path, "only", 0.5, 0.6, 0.6)
    assert main([str(one), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "empty").mkdir()
    assert main([str(one), str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "holds no metrics" in capsys.readouterr().err


def test_a_claim_one_study_names_bare_lines_up_with_the_others_settings():
    """The near study ran no unlearning (its bare n/a row), the far one per N: one row per N, in
    the bare row's place, each with the near study's n/a cell."""
    claims = ["TAFT-1 within 1 pt of NLFT-1", "TAFT subtract ≥ SISA drop", "DP TAFT ≥ DP NLFT, ε = 1",
              "TAFT subtract ≥ SISA drop, N = 10", "TAFT subtract ≥ SISA drop, N = 50",
              "Matching before merging raises the soup's accuracy: last, N = 10, shared"]
    order, per_setting = rows_by_setting(claims)
    assert order == ["TAFT-1 within 1 pt of NLFT-1", "TAFT subtract ≥ SISA drop, N = 10",
                     "TAFT subtract ≥ SISA drop, N = 50", "DP TAFT ≥ DP NLFT, ε = 1",
                     "Matching before merging raises the soup's accuracy: last, N = 10, shared"]
    assert bare_claim("TAFT subtract ≥ SISA drop, N = 50", per_setting) == "TAFT subtract ≥ SISA drop"
    assert bare_claim("DP TAFT ≥ DP NLFT, ε = 1", per_setting) == "DP TAFT ≥ DP NLFT, ε = 1"


def test_the_real_table_puts_the_bare_n_a_cell_on_each_setting_row(tmp_path):
    far = _study(tmp_path, "far-study", 0.58, 0.70, 0.62, soups={"taft-1": 0.60, "nlft-1": 0.50})
    near = _study(tmp_path, "near-study", 0.80, 0.805, 0.81)
    assert main([str(far), str(near), "--out", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / "claims_by_regime.md").read_text().splitlines()
    table2 = [line for line in lines if line.startswith("| TAFT composition")]
    assert len(table2) == 1 and "N = 10" in table2[0], table2
    assert "**n/a**" in table2[0] and "**yes**: taft-1 Δw sum 60.0 %" in table2[0]
