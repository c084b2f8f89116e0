"""bench_gpu_study.py's per-rule rows: the share of the GPU's nominal dense peak in the dtype the
rule computes in (issue 41: a float32 probe overstated bf16 jobs about 15-fold)."""
from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_gpu_study import markdown, nominal_peak, rule_rows  # noqa: E402 (a script's folder)


def test_nominal_peaks_by_gpu_name_and_dtype():
    assert nominal_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989.0
    assert nominal_peak("NVIDIA H100 PCIe", "bfloat16") == 756.0  # not the SXM part's
    assert nominal_peak("NVIDIA H200", "float32") == 67.0
    assert nominal_peak("Tesla T4", "bfloat16") is None and nominal_peak("NVIDIA H200", "int8") is None


def test_rule_rows_give_the_share_of_the_dtypes_peak(tmp_path):
    csv = tmp_path / "efficiency.csv"
    csv.write_text("rule,jobs,wall_s,images,images_per_s,gflop_per_s,peak_gflop_per_s,peak_pct\n"
                   "features,1,6.2,10000,1606,52000,51000,101.96\n"
                   "prepare,1,1.0,,,,,\n")
    feats, prep = rule_rows(csv, "vitb", "NVIDIA H200", "bfloat16")
    assert feats["nominal_peak_pct"] == pytest.approx(100 * 52000 / 989000)  # 5.3 %, where the table said 102 %
    assert feats["table_peak_pct"] == pytest.approx(101.96) and feats["dtype"] == "bfloat16"
    assert prep["nominal_peak_pct"] is None and prep["images_per_s"] is None
    assert "| vitb | rule | features |" in markdown([feats, prep])
    assert rule_rows(tmp_path / "missing.csv", "vitb", "cpu", "float32") == []
