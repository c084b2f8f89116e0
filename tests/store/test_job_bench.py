"""The launcher's benchmark file has Snakemake's own format, and the `jobs` view reads it as one of Snakemake's."""
from __future__ import annotations

from snakemake.benchmark import BenchmarkRecord

from pipeline_src.store.job_bench import bench_path, write_job_bench
from pipeline_src.store.results_db import connect


def test_the_header_is_snakemakes_and_the_row_its_units(tmp_path):
    log = tmp_path / "logs" / "train" / "m" / "n2_s0" / "shard0.log"
    log.parent.mkdir(parents=True)
    path = write_job_bench(log, 3723.25, 2048 * 1024, 1861.5)
    assert path == bench_path(log) == log.with_name("shard0.bench.tsv")
    header, row, *rest = path.read_text().split("\n")
    assert header.split("\t") == BenchmarkRecord.get_header() and rest == [""]
    values = dict(zip(header.split("\t"), row.split("\t")))
    assert values["h:m:s"] == "1:02:03" and float(values["s"]) == 3723.25
    assert float(values["max_rss"]) == 2048.0  # MB, as Snakemake's psutil figures
    assert float(values["cpu_time"]) == 1861.5 and float(values["mean_load"]) == 50.0
    assert values["max_vms"] == "NA"  # not measured: Snakemake's own word for it


def test_unmeasured_figures_are_na_and_the_jobs_view_reads_the_file(tmp_path):
    results = tmp_path / "results" / "study"
    log = results / "logs" / "compose" / "m" / "soup.log"
    log.parent.mkdir(parents=True)
    write_job_bench(log, 0.5, None, None)
    con = connect(results)
    s, rss, cpu = con.execute("SELECT s, max_rss, cpu_time FROM jobs").fetchone()
    assert s == 0.5 and rss is None and cpu is None
