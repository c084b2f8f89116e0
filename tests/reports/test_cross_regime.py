"""The cross-regime claims table: two studies' results folders, a column each, nearest first."""
from __future__ import annotations

import csv

import pytest

from pipeline_src.reports.cross_regime import main
from tests.reports.test_claims import record, row, write_study


def _study(tmp_path, name, fc, nlft, taft):
    rows = [row("fc", "shard", 1, fc), row("nlft-1", "shard", 1, nlft), row("taft-1", "shard", 1, taft)]
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
