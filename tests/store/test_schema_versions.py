"""Metrics files written by an older schema must stay readable next to current ones.

The metrics schema only ever gains columns (`pipeline_src/store/metrics.py`), and readers use
`read_parquet(..., union_by_name=true)`. The first released layout of schema version 1 (commit
b10f09b, frozen below) had no `variant` column; `results/` directories from before that column
was added must still load into the `metrics` view and produce the reports.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_src.reports.report import REPORTS
from pipeline_src.store.metrics import METRICS_SCHEMA, SCHEMA_VERSION, write_metrics
from pipeline_src.store.results_db import connect

# Frozen copy of METRICS_SCHEMA as first written (b10f09b:pipeline_src/store/metrics.py): no `variant`.
SCHEMA_V1_INITIAL = pa.schema([
    ("schema_version", pa.int32()),
    ("experiment", pa.string()),
    ("dataset", pa.string()),
    ("method", pa.string()),
    ("kind", pa.string()),
    ("model", pa.string()),
    ("shards", pa.int64()),
    ("shard_id", pa.int64()),
    ("seed", pa.int64()),
    ("split", pa.string()),
    ("metric", pa.string()),
    ("value", pa.float64()),
    ("num_samples", pa.int64()),
    ("wall_time_s", pa.float64()),
    ("peak_mem_mb", pa.float64()),
    ("device", pa.string()),
    ("commit", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
])


def row(method: str, kind: str, model: str, shards: int, shard_id: int | None, value: float, **extra) -> list[dict]:
    common = dict(schema_version=1, experiment="old", dataset="digits", method=method, kind=kind, model=model,
                  shards=shards, shard_id=shard_id, seed=0, split="test", num_samples=100, wall_time_s=1.0,
                  peak_mem_mb=10.0, device="cpu", commit="b10f09b", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    return [{**common, "metric": "accuracy", "value": value, **extra},
            {**common, "metric": "loss", "value": 1.0 - value, **extra}]


def write_old(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA_V1_INITIAL), path)


def old_study(results: Path) -> None:
    """fc at N = 1 and N = 2 (two shards, soup, ensemble), as the old code laid it out."""
    ev = results / "metrics" / "evaluate" / "fc"
    write_old(ev / "n1_s0" / "shard0.parquet", row("fc", "fc", "shard", 1, 0, 0.9))
    for i, acc in enumerate((0.7, 0.8)):
        write_old(ev / "n2_s0" / f"shard{i}.parquet", row("fc", "fc", "shard", 2, i, acc))
    write_old(ev / "n2_s0" / "soup.parquet", row("fc", "fc", "soup", 2, None, 0.85))
    write_old(ev / "n2_s0" / "ensemble.parquet", row("fc", "fc", "ensemble", 2, None, 0.86))


def test_the_frozen_old_schema_is_a_prefix_of_the_current_one():
    # Columns are only ever added: every old column keeps its name and type.
    assert SCHEMA_VERSION == 2  # 2 added `environment` (issue 17)
    for field in SCHEMA_V1_INITIAL:
        assert METRICS_SCHEMA.field(field.name).type == field.type, field.name
    assert set(METRICS_SCHEMA.names) - set(SCHEMA_V1_INITIAL.names) == {"variant", "environment"}


def test_old_and_current_files_read_together(tmp_path):
    results = tmp_path / "results"
    old_study(results)
    study_row = row("taft-1", "taft", "fusion-soup", 2, None, 0.5, variant='{"study": "fusion"}')
    write_metrics(row("nlft-1", "nlft", "shard", 1, 0, 0.95) + study_row, results / "metrics" / "evaluate" / "new.parquet")

    con = connect(results)
    types = dict(con.sql("SELECT column_name, column_type FROM (DESCRIBE metrics)").fetchall())
    assert types["variant"] == "VARCHAR" and types["shard_id"] == "BIGINT" and types["value"] == "DOUBLE"
    got = con.sql("""SELECT method, model, shard_id, variant, value FROM metrics WHERE metric = 'accuracy'
                     ORDER BY method, model, shard_id""").fetchall()
    assert sorted(got, key=repr) == sorted([
        ("fc", "ensemble", None, None, 0.86), ("fc", "shard", 0, None, 0.9), ("fc", "shard", 0, None, 0.7),
        ("fc", "shard", 1, None, 0.8), ("fc", "soup", None, None, 0.85),
        ("nlft-1", "shard", 0, None, 0.95), ("taft-1", "fusion-soup", None, '{"study": "fusion"}', 0.5),
    ], key=repr)

    out = tmp_path / "report"
    out.mkdir()
    for report in REPORTS.values():
        report(con, out)
    accuracy = (out / "accuracy.csv").read_text()
    assert "fc,fc,1,full-data,0.9" in accuracy and "nlft-1,nlft,1,full-data,0.95" in accuracy
    assert "fc,fc,2,soup,0.85" in accuracy and "fusion" not in accuracy  # rows with a variant stay out


def test_a_results_dir_with_only_old_files_still_reports(tmp_path):
    results = tmp_path / "results"
    old_study(results)
    con = connect(results)
    assert con.sql("SELECT count(*) FROM metrics").fetchall() == [(10,)]
    out = tmp_path / "report"
    out.mkdir()
    for report in REPORTS.values():
        report(con, out)
    assert "fc,fc,2,shard-mean,0.75" in (out / "accuracy.csv").read_text()
