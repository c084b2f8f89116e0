"""Benchmark reports: ratios and layouts from BENCHMARK_SCHEMA rows with known numbers."""
from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta, timezone

import pytest

from pipeline_src.reports import benchmarks as report_benchmarks
from pipeline_src.store import results_db
from pipeline_src.store.benchmark_rows import write_benchmark_rows

GPU, CPU = "cuda: Test GPU", "cpu: test x2 threads"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def row(benchmark, case, time_ms, mem_mb, sizes, device=GPU, age_s=0):
    return {"benchmark": benchmark, "case": case, "device": device, "sizes": json.dumps(sizes, sort_keys=True),
            "time_ms_median": time_ms, "time_ms_all": [time_ms] * 3, "peak_mem_mb": mem_mb, "repeats": 3,
            "commit": "test", "created_at": T0 - timedelta(seconds=age_s)}


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture
def results(tmp_path):
    bench = tmp_path / "results" / "benchmarks"
    last = {"batch": 32, "grid": 16}
    write_benchmark_rows("bench_last", [
        row("bench_last", "full", 100.0, 4000.0, last), row("bench_last", "nlft1", 40.0, 800.0, last),
        row("bench_last", "last", 50.0, 1000.0, last), row("bench_last", "grid16", 150.0, 16000.0, last),
        row("bench_last", "full", 20.0, 100.0, last, device=CPU), row("bench_last", "last", 5.0, 50.0, last, device=CPU),
    ], bench)
    # An older run of the same case in another file: the newest row wins.
    write_benchmark_rows("bench_last_old", [row("bench_last", "last", 999.0, 9999.0, last, age_s=3600)], bench)
    dp = []
    for case, t0, m0 in (("fc-B32-p768", 1.0, 2.0), ("nlft-features-full", 10.0, 100.0)):
        for mode, k in (("nonprivate", 1), ("hooks", 4), ("ghost", 3), ("fast", 2), ("bk", 1.5)):
            dp.append(row("bench_dp", f"{case}:{mode}", t0 * k, m0 * k, {"case": case, "mode": mode, "clock": "wall"}))
    write_benchmark_rows("bench_dp", dp, bench)
    taft = {"batch": 32}
    write_benchmark_rows("bench_taft", [
        row("bench_taft", "plain_forward", 10.0, 100.0, taft), row("bench_taft", "tangent_forward_taft1", 12.0, 300.0, taft),
        row("bench_taft", "funcjvp_forward_taft1", 15.0, 250.0, taft),
    ], bench)
    write_benchmark_rows("bench_matching_cpu", [
        row("bench_matching", "match_full", ms, 1.0, {"model": m, "params": p, "workers": 2}, device=CPU)
        for m, p, ms in (("tiny", 1000, 5.0), ("vit_b", 86_000_000, 5000.0))
    ] + [row("bench_matching", "match_ffn", 3.0, 1.0, {"model": "tiny", "params": 1000, "workers": 2}, device=CPU)], bench)
    un = {"method": "taft-1", "epochs": 2}
    write_benchmark_rows("unlearning", [row("unlearning", "paragon", 1000.0, 0.0, {**un, "samples": 99}, device=CPU)] + [
        row("unlearning", "retrain-shard", ms, 0.0, {**un, "shards": n, "samples": 99 // n, "goal_speedup": n / 2}, device=CPU)
        for n, ms in ((10, 250.0), (50, 10.0))], bench)
    return tmp_path


def test_last_table7(results, tmp_path):
    out = tmp_path / "out"
    paths = report_benchmarks.last_table7(results_db.connect(results / "results"), out)
    rows = {(r["device"], r["case"]): r for r in read_csv(out / "bench_last_table7.csv")}
    assert float(rows[GPU, "last"]["mem / full"]) == pytest.approx(0.25)
    assert float(rows[GPU, "last"]["time / full"]) == pytest.approx(0.5)
    assert float(rows[GPU, "grid16"]["mem / full"]) == pytest.approx(4.0)
    assert float(rows[CPU, "last"]["time / full"]) == pytest.approx(0.25)
    assert [r["case"] for r in read_csv(out / "bench_last_table7.csv") if r["device"] == GPU] == ["full", "nlft1", "last", "grid16"]
    md = (out / "bench_last_table7.md").read_text()
    assert md.count("## ") == 2 and "999" not in md
    assert all(p.exists() for p in paths)


def test_dp_figure(results, tmp_path):
    out = tmp_path / "out"
    paths = report_benchmarks.dp_figure(results_db.connect(results / "results"), out)
    rows = {r["case"]: r for r in read_csv(out / "bench_dp_ratios.csv")}
    assert set(rows) == {"fc-B32-p768", "nlft-features-full"}
    for mode, k in (("hooks", 4), ("ghost", 3), ("fast", 2), ("bk", 1.5)):
        assert float(rows["fc-B32-p768"][f"{mode} time×"]) == pytest.approx(k)
        assert float(rows["nlft-features-full"][f"{mode} mem×"]) == pytest.approx(k)
    assert (out / "bench_dp_figure.png").stat().st_size > 0 and out / "bench_dp_figure.png" in paths


def test_taft_ratios(results, tmp_path):
    out = tmp_path / "out"
    report_benchmarks.taft_ratios(results_db.connect(results / "results"), out)
    (r,) = read_csv(out / "bench_taft_ratios.csv")
    assert r["variant"] == "taft1"
    assert float(r["tangent / plain time"]) == pytest.approx(1.2)
    assert float(r["tangent / jvp time"]) == pytest.approx(0.8)
    assert float(r["tangent / jvp mem"]) == pytest.approx(1.2)


def test_matching_scaling(results, tmp_path):
    out = tmp_path / "out"
    paths = report_benchmarks.matching_scaling(results_db.connect(results / "results"), out)
    rows = read_csv(out / "bench_matching_scaling.csv")
    assert [(r["model"], float(r["match_full ms"])) for r in rows] == [("tiny", 5.0), ("vit_b", 5000.0)]
    assert float(rows[0]["match_ffn ms"]) == 3.0
    assert (out / "bench_matching_scaling.png").exists() and out / "bench_matching_scaling.png" in paths


def test_unlearning_speedup(results, tmp_path):
    out = tmp_path / "out"
    report_benchmarks.unlearning_speedup(results_db.connect(results / "results"), out)
    rows = {int(r["N"]): r for r in read_csv(out / "bench_unlearning_speedup.csv")}
    assert float(rows[10]["speedup"]) == pytest.approx(4.0) and rows[10]["meets goal"] == "False"
    assert float(rows[50]["speedup"]) == pytest.approx(100.0) and rows[50]["meets goal"] == "True"


def test_no_benchmark_rows(tmp_path):
    (tmp_path / "results").mkdir()
    con = results_db.connect(tmp_path / "results")
    for name, report in report_benchmarks.REPORTS.items():
        assert report(con, tmp_path / "out") == [], name
    assert not (tmp_path / "out").exists()


def test_registered():
    from pipeline_src.reports.report import REPORTS

    assert set(report_benchmarks.REPORTS) <= set(REPORTS)
