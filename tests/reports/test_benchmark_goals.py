"""Benchmark goal table: each ratio beside its goal and floor, from Parquet rows written through the
real row API (`benchmark_row`, `write_benchmark_rows`), one set measured by bench_last itself."""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline_src.reports import benchmark_goals
from pipeline_src.reports import benchmarks as report_benchmarks
from pipeline_src.store import results_db
from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows

REPO = Path(__file__).resolve().parents[2]


def read(path: Path) -> dict[str, dict]:
    with open(path) as f:
        return {r["measure"]: r for r in csv.DictReader(f)}


@pytest.fixture
def results(tmp_path):
    bench = tmp_path / "results" / "benchmarks"
    taft = dict(depth=6, embed_dim=192, batch=8, img_size=32, patch_size=4, clock="process")
    write_benchmark_rows("bench_taft", [benchmark_row("bench_taft", c, "cpu", taft, [t, t], m) for c, t, m in (
        ("plain_forward", 9.0, 5.0), ("tangent_forward_taft1", 14.0, 6.0), ("funcjvp_forward_taft1", 16.0, 7.0),
        ("tangent_forward_taftall", 30.0, 9.0), ("funcjvp_forward_taftall", 30.0, 9.5),
        ("train_step_features_taft1", 12.0, 3.0), ("nlft_train_step_features_taft1", 10.0, 3.0))], bench)
    dp = []
    for mode, k_t, k_m in (("nonprivate", 1.0, 1.0), ("bk", 1.3, 1.05), ("fast", 1.1, 1.5)):
        for case in ("nlft-features-full", "nlft-features-fc"):
            dp.append(benchmark_row("bench_dp", f"{case}:{mode}", "cpu", {"regime": case, "mode": mode, "clock": "cpu"},
                                    [100.0 * k_t], 40.0 * k_m))
    write_benchmark_rows("bench_dp", dp, bench)
    write_benchmark_rows("bench_matching_cpu", [
        benchmark_row("bench_matching", "match_full", "cpu", {"model": m, "workers": 2}, [ms], 50.0)
        for m, ms in (("vit_s", 2000.0), ("vit_b", 6000.0))], bench)
    return tmp_path


def test_goal_table_from_rows(results, tmp_path, monkeypatch):
    # bench_last itself, at tiny sizes, writes the LAST rows (its own peak and times).
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_last

    monkeypatch.setattr(sys, "argv", ["bench_last.py", "--quick", "--batch", "2", "--grid", "2", "--rank", "4",
                                      "--heads", "2", "--cases", "last,grid", "--repeats", "1", "--threads", "1", "--clock", "process",
                                      "--out-dir", str(results / "results" / "benchmarks")])
    import torch
    threads = torch.get_num_threads()
    try:
        bench_last.main()
    finally:
        torch.set_num_threads(threads)
    last = pq.read_table(results / "results" / "benchmarks" / "bench_last.parquet").to_pydict()
    t = dict(zip(last["case"], last["time_ms_median"]))
    m = dict(zip(last["case"], last["peak_mem_mb"]))
    assert set(t) == {"last", "grid2"} and min(m.values()) > 0

    out = tmp_path / "report"
    out.mkdir()
    paths = report_benchmarks.bench_goals(results_db.connect(results / "results"), out)
    assert [p.name for p in paths] == ["bench_goals.md", "bench_goals.csv"]
    got = read(out / "bench_goals.csv")
    jvp1 = got["TAFT-1 tangent forward / torch.func.jvp"]
    assert float(jvp1["value"]) == pytest.approx(14 / 16) and float(jvp1["goal"]) == 0.9 and jvp1["meets goal"] == "True"
    assert got["TAFT-all tangent forward / torch.func.jvp"]["meets goal"] == "False"  # 1.0 > 0.9
    plain = got["TAFT-1 tangent forward / plain forward"]
    assert float(plain["floor"]) == pytest.approx(8 / 6)  # (depth - 1 + 3) / depth
    assert float(plain["goal"]) == pytest.approx(1.05 * 8 / 6) and plain["meets goal"] == "False"  # 14 / 9 > 1.4
    nlft = got["TAFT-1 / NLFT-1 train step (cached features)"]
    assert float(nlft["value"]) == pytest.approx(1.2) and float(nlft["reference"]) == 1.39
    # matrix-product floor of one tuned block: TAFT 5 products per Linear and attention product (less
    # 2 qkv: no input tangent, no input gradient), NLFT 3 (less 1 qkv); D 192, 65 tokens
    L, A, qkv = 12 * 192**2, 2 * 65 * 192, 3 * 192**2
    assert float(nlft["floor"]) == pytest.approx((5 * L + 5 * A - 2 * qkv) / (3 * L + 3 * A - qkv))
    assert "TAFT-all / NLFT-all train step (cached features)" not in got  # no NLFT-all row: no line
    grid = got["2 LAST networks / one (time)"]
    assert float(grid["value"]) == pytest.approx(t["grid2"] / t["last"]) and float(grid["goal"]) == 3.0
    assert float(got["2 LAST networks / one (memory)"]["value"]) == pytest.approx(m["grid2"] / m["last"])
    bk_t, bk_m = got["DP bk / non-private, nlft-features-full (time)"], got["DP bk / non-private, nlft-features-full (memory)"]
    assert float(bk_t["value"]) == pytest.approx(1.3) and bk_t["meets goal"] == "False"
    assert float(bk_m["value"]) == pytest.approx(1.05) and float(bk_m["goal"]) == 1.1 and bk_m["meets goal"] == "True"
    assert got["DP fast / non-private, nlft-features-full (time)"]["meets goal"] == "True"
    assert not any("nlft-features-fc" in k for k in got)  # goals cover the full regime only
    vit_b = got["matching a ViT-B pair"]
    assert (float(vit_b["value"]), float(vit_b["goal"]), vit_b["unit"], vit_b["meets goal"]) == (6.0, 5.0, "s", "False")
    md = (out / "bench_goals.md").read_text()
    assert "| measure" in md and "floor" in md and "goal" in md
    assert "bench_goals" in report_benchmarks.REPORTS


def test_no_rows_no_table(tmp_path):
    (tmp_path / "results").mkdir()
    assert report_benchmarks.bench_goals(results_db.connect(tmp_path / "results"), tmp_path) == []


def test_missing_memory_is_nan_not_a_pass():
    line = benchmark_goals._line("x", math.nan, 1.1)
    assert line["meets goal"] is None
