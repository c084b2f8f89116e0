"""Where each searched method trained: the selected point behind every N's models.

`trained_points.{md,csv}`: one row per searched method and shard count N of the main study, read
from the model records (the `models` view): the grid point the models trained at (the `select`
record's candidate, `plan/selected_point.py`), the N its choice was made at (N itself where the
search ran there, else the nearest searched N), the learning rate, PT and CLS it set, and how many
seeds and shard models trained there. The accuracy tables (Table 1, Table 2) name each method
by its name only; this table says which point that name stood for at each N.
"""
from __future__ import annotations

from pathlib import Path

import duckdb

from pipeline_src.reports.files import has_rows, save_table

TRAINED_POINTS_SQL = """
WITH records AS (
  SELECT method, shards, seed, to_json(method_config) AS config FROM models
  WHERE kind = 'trained' AND json_extract_string(to_json(method_config), '$.selected.candidate') IS NOT NULL)
SELECT method, shards AS N, json_extract_string(config, '$.selected.candidate') AS trained_at,
       CAST(json_extract(config, '$.selected.chosen_at_shards') AS BIGINT) AS chosen_at_N,
       printf('%g', CAST(json_extract(config, '$.lr') AS DOUBLE)) AS LR,
       CASE json_extract_string(config, '$.selected.pt') WHEN 'true' THEN 'T' WHEN 'false' THEN 'F' ELSE '' END AS PT,
       CASE json_extract_string(config, '$.selected.cls') WHEN 'true' THEN 'T' WHEN 'false' THEN 'F' ELSE '' END AS CLS,
       count(DISTINCT seed) AS seeds, count(*) AS models
FROM records GROUP BY ALL ORDER BY method, N, trained_at
"""


def trained_points_report(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Write `trained_points.{md,csv}` when the study trained a method at a selected point."""
    if not has_rows(con, "models", "kind = 'trained'"):
        return []
    df = con.sql(TRAINED_POINTS_SQL).df()
    if df.empty:
        return []
    return save_table(df, out_dir, "trained_points",
                      "Selected points trained: per searched method and N, the grid point its models trained at "
                      "(chosen on validation at chosen_at_N)")


REPORTS: dict = {"trained_points": trained_points_report}
