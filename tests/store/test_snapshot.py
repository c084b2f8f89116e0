"""`results_db.snapshot`: the report's small views copied into tables once. The reference is the
live views: every report writes the same tables from either, and the copy keeps what it read."""
from __future__ import annotations

from pathlib import Path

from pipeline_src.reports.report import REPORTS
from pipeline_src.store.job_bench import write_job_bench
from pipeline_src.store.metrics import write_metrics
from pipeline_src.store.results_db import SNAPSHOT_VIEWS, connect, snapshot
from tests.store.test_schema_versions import old_study, row


def study(results: Path) -> None:
    """Old and current metrics files, and two jobs' benchmark files."""
    old_study(results)
    write_metrics(row("nlft-1", "nlft", "shard", 1, 0, 0.95), results / "metrics" / "evaluate" / "new.parquet")
    for i, wall in enumerate((1.5, 2.5)):
        log = results / "logs" / "train" / "fc" / "n2_s0" / f"shard{i}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        write_job_bench(log, wall, 2048 * (i + 1), wall / 2)


def written_tables(con, out: Path) -> dict[str, str]:
    """Every report's CSV and Markdown files, by name (PNGs carry no table of their own)."""
    out.mkdir()
    for report in REPORTS.values():
        report(con, out)
    return {p.name: p.read_text() for p in sorted(out.iterdir()) if p.suffix in (".csv", ".md")}


def one_thread(con):
    """One DuckDB thread: its scans then add rows in file order, from files or from the copy, so
    the reports' sums round alike and their text can be compared exactly on any CPU."""
    con.execute("SET threads = 1")
    return con


def test_every_report_writes_the_same_tables_from_the_snapshot(tmp_path):
    results = tmp_path / "results"
    study(results)
    live = written_tables(one_thread(connect(results)), tmp_path / "live")
    con = one_thread(connect(results))
    assert snapshot(con) == ["metrics", "jobs"]  # the views this folder has, in SNAPSHOT_VIEWS' order
    assert set(SNAPSHOT_VIEWS) >= {"metrics", "jobs"}
    assert written_tables(con, tmp_path / "snapshot") == live
    assert "accuracy.csv" in live and "efficiency.csv" in live


def test_the_snapshot_keeps_what_it_read_and_the_views_built_on_it_follow(tmp_path):
    results = tmp_path / "results"
    study(results)
    con = connect(results)
    snapshot(con)
    count = "SELECT count(*) FROM {}"
    before = {v: con.sql(count.format(v)).fetchall() for v in ("metrics", "metrics_selected", "jobs")}
    write_metrics(row("taft-1", "taft", "shard", 1, 0, 0.5), results / "metrics" / "evaluate" / "later.parquet")
    write_job_bench(results / "logs" / "later.log", 9.0, None, None)
    assert {v: con.sql(count.format(v)).fetchall() for v in before} == before  # one consistent set of files
    fresh = connect(results)
    assert fresh.sql(count.format("metrics")).fetchall()[0][0] == before["metrics"][0][0] + 2
    assert fresh.sql(count.format("jobs")).fetchall()[0][0] == before["jobs"][0][0] + 1
