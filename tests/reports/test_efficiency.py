"""The per-rule efficiency table on hand-made benchmark files and job counters, through real DuckDB."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from pipeline_src.reports.efficiency import efficiency_report, rule_of_log
from pipeline_src.store.atomic import write_parquet
from pipeline_src.store.job_counters import COUNTERS_SCHEMA
from pipeline_src.store.job_rss import write_job_rss
from pipeline_src.store.results_db import connect

BENCH_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def bench(results: Path, rel: str, seconds: float) -> Path:
    path = results / "logs" / f"{rel}.bench.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BENCH_HEADER + f"{seconds}\t0:00:{int(seconds):02d}\t100\t200\t90\t95\t0\t1\t50\t{seconds / 2}\n")
    return path


def counters(results: Path, rel: str, rule: str, images: int, flops_per_image: float | None, threads: int = 1,
             step_wall_s: float = 1.0, math: str | None = "float32") -> None:
    row = {"rule": rule, "images": images, "flops": None if flops_per_image is None else images * flops_per_image,
           "flop_images": images if flops_per_image is not None else 0,
           "phases": json.dumps({"x": {"images": images, "flops_per_image": flops_per_image}}),
           "device": "cpu", "math": math, "device_name": "test cpu", "threads": threads, "step_wall_s": step_wall_s,
           "created_at": datetime.now(timezone.utc)}
    write_parquet(pa.Table.from_pylist([row], schema=COUNTERS_SCHEMA), results / "logs" / f"{rel}.counters.parquet")


def rss(results: Path, rel: str, mb: float) -> None:
    write_job_rss(results / "logs" / f"{rel}.log", int(mb * 1024), "wait4: test", 0)


MODE_SPEED = {"float32": 1, "bfloat16": 8}  # the made-up machine's peaks per math mode, in units of `flops_per_s`


def fixed_peak(flops_per_s: float):
    def peak(device: str, threads: int, math: str):
        return (flops_per_s * threads * MODE_SPEED[math], f"test cpu ({threads} threads, {math})") if device == "cpu" else None
    peak.cache = {("cpu", 1, "float32"): (flops_per_s, "test cpu (1 thread, float32)")}
    return peak


@pytest.fixture
def study(tmp_path) -> Path:
    r = tmp_path / "results"
    # train: two jobs, 10 s and 30 s, 1,000 and 3,000 images at 2 MFLOP each
    bench(r, "train/taft-1/n2_s0/shard0", 10.0)
    counters(r, "train/taft-1/n2_s0/shard0", "train", 1000, 2e6, step_wall_s=8.0)
    rss(r, "train/taft-1/n2_s0/shard0", 700.0)
    rss(r, "train/taft-1/n2_s0/shard1", 900.5)  # the rule's largest
    bench(r, "train/taft-1/n2_s0/shard1", 30.0)
    counters(r, "train/taft-1/n2_s0/shard1", "train", 3000, 2e6, step_wall_s=28.0)
    # evaluate_ensemble: one job, 20 s, 500 images at 10 MFLOP
    bench(r, "evaluate/taft-1/n2_s0/ensemble", 20.0)
    counters(r, "evaluate/taft-1/n2_s0/ensemble", "evaluate_ensemble", 500, 1e7, threads=2, step_wall_s=15.0)
    rss(r, "evaluate/taft-1/n2_s0/ensemble", 650.0)
    rss(r, "evaluate/taft-1/n2_s0/soup", 9999.0)  # no benchmark file (the job failed): not in the table
    # evaluate_shard: a benchmark without counters (an older run): its rule from the path
    bench(r, "evaluate/taft-1/n2_s0/shard0", 5.0)
    # compose: counts no images
    bench(r, "compose/taft-1/n2_s0/soup", 2.0)
    counters(r, "compose/taft-1/n2_s0/soup", "compose", 0, None, step_wall_s=0.5)
    return r


def test_rule_of_log_paths():
    assert rule_of_log("results/logs/evaluate/last/n4_s0/ensemble.bench.tsv") == "evaluate_ensemble"
    assert rule_of_log("results/logs/evaluate/last/n4_s0/soup.bench.tsv") == "evaluate_soup"
    assert rule_of_log("results/logs/evaluate/last/n4_s0/shard3.bench.tsv") == "evaluate_shard"  # runs before
    assert rule_of_log("results/logs/evaluate/last/n4_s0/shards.bench.tsv") == "evaluate_shards"
    assert rule_of_log("results/logs/train/taft-1/n4_s0/vectorized.bench.tsv") == "train_vectorized"
    assert rule_of_log("/x/results/logs/features/blocks.bench.tsv") == "features"
    assert rule_of_log("results/logs/train_private/ours/nlft-1/full/eps8/n1_s0/shard0.bench.tsv") == "train_private"


def test_efficiency_table(study, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    paths = efficiency_report(connect(study), out, peak=fixed_peak(1e9))  # 1 GFLOP/s per thread
    assert [p.name for p in paths] == ["efficiency.md", "efficiency.csv"]
    df = pd.read_csv(out / "efficiency.csv").set_index("rule")
    assert list(df.index) == ["train", "evaluate_ensemble", "evaluate_shard", "compose"]  # longest first
    tr, ev = df.loc["train"], df.loc["evaluate_ensemble"]
    assert (tr.jobs, tr.wall_s, tr.images) == (2, 40.0, 4000)
    assert tr.wall_share_pct == pytest.approx(100 * 40 / 67)
    assert tr.in_step_pct == pytest.approx(100 * 36 / 40)
    assert tr.outside_step_s == pytest.approx((10 - 8) + (30 - 28))  # the fixed cost, summed over the jobs
    assert ev.outside_step_s == pytest.approx(20 - 15) and df.loc["compose"].outside_step_s == pytest.approx(1.5)
    assert tr.images_per_s == pytest.approx(100.0)
    assert tr.gflop_per_image == pytest.approx(2e-3)
    assert tr.gflop_per_s == pytest.approx(4000 * 2e6 / 40 / 1e9)
    assert tr.peak_gflop_per_s == pytest.approx(1.0) and tr.peak_pct == pytest.approx(20.0)
    assert tr.in_step_peak_pct == pytest.approx(100 * 4000 * 2e6 / 36 / 1e9)  # over the steps' 8 + 28 s
    assert tr.peak_rss_mb == pytest.approx(900.5) and ev.peak_rss_mb == pytest.approx(650.0)  # max over the rule's jobs
    # two threads: the peak at two threads
    assert ev.images_per_s == pytest.approx(25.0) and ev.gflop_per_s == pytest.approx(0.25)
    assert ev.peak_gflop_per_s == pytest.approx(2.0) and ev.peak_pct == pytest.approx(12.5)
    sh, co = df.loc["evaluate_shard"], df.loc["compose"]
    assert sh.jobs == 1 and sh.wall_s == 5.0 and pd.isna(sh.images) and pd.isna(sh.gflop_per_s)
    assert pd.isna(sh.outside_step_s)  # no counters, no step time: not guessed
    assert pd.isna(sh.peak_rss_mb) and pd.isna(df.loc["compose"].peak_rss_mb)  # no peak file: none shown
    assert co.wall_s == 2.0 and pd.isna(co.images) and pd.isna(co.peak_pct)
    md = (out / "efficiency.md").read_text()
    assert "test cpu (1 thread, float32): 1.0 GFLOP/s" in md and "evaluate_ensemble" in md
    assert tr.math == "float32" and list(df.columns).index("math") == list(df.columns).index("peak_gflop_per_s") + 1


def test_each_rule_is_set_against_the_peak_of_its_math_mode(tmp_path):
    r = tmp_path / "results"
    for rel, rule, math in (("features/blocks", "features", "bfloat16"), ("train/fc/n1_s0/shard0", "train", "float32")):
        bench(r, rel, 10.0)
        counters(r, rel, rule, 1000, 1e7, math=math, step_wall_s=10.0)  # 1 GFLOP/s achieved by each
    df = pd.read_csv(efficiency_report(connect(r), tmp_path, peak=fixed_peak(1e9))[1]).set_index("rule")
    assert df.loc["features"].math == "bfloat16" and df.loc["features"].peak_gflop_per_s == pytest.approx(8.0)
    assert df.loc["features"].peak_pct == pytest.approx(12.5)  # against a float32 probe it would read 100 %
    assert df.loc["train"].math == "float32" and df.loc["train"].peak_pct == pytest.approx(100.0)


def test_counters_written_before_the_math_mode_count_as_float32(tmp_path):
    r = tmp_path / "results"
    bench(r, "train/fc/n1_s0/shard0", 10.0)
    counters(r, "train/fc/n1_s0/shard0", "train", 1000, 1e7, step_wall_s=10.0)
    path = r / "logs" / "train/fc/n1_s0/shard0.counters.parquet"
    import pyarrow.parquet as pq

    old = pq.read_table(path).drop_columns(["math"])  # the schema before issue 41
    path.unlink()
    write_parquet(old, path)
    df = pd.read_csv(efficiency_report(connect(r), tmp_path, peak=fixed_peak(1e9))[1])
    assert df.math.tolist() == ["float32"] and df.peak_pct.tolist() == [pytest.approx(100.0)]


def test_no_benchmark_files_no_table(tmp_path):
    (tmp_path / "results" / "metrics").mkdir(parents=True)
    assert efficiency_report(connect(tmp_path / "results"), tmp_path, peak=fixed_peak(1e9)) == []


def test_benchmarks_without_any_counters(tmp_path):
    r = tmp_path / "results"
    bench(r, "prepare/prepare", 3.0)
    df = pd.read_csv(efficiency_report(connect(r), tmp_path, peak=fixed_peak(1e9))[1])
    assert df.rule.tolist() == ["prepare"] and df.wall_s.tolist() == [3.0] and df.images.isna().all()
    assert df.peak_rss_mb.isna().all()
