"""Ablation reports of the TAFT paper (Liu, Soatto et al., "Tangent Transformers for
Composition, Privacy and Removal", ICLR 2024), see pipeline_src/reports/report.py:

- `fig4_weight_distance`: Fig. 4, the L2 distance of the fine-tuned weights from their starting
  (pre-trained) values per method, for the full-data model, the mean single shard and the soup
  or Δw sum, from the `weight_distance` rows of `evaluate` (`methods/weight_distance.py`).
"""
from __future__ import annotations

from pathlib import Path

import duckdb

from pipeline_src.reports.files import has_rows, save_table

DISTANCE_SQL = """
SELECT method, any_value(kind) AS kind, shards AS N,
       CASE WHEN model = 'shard' AND shards > 1 THEN 'shard-mean' WHEN model = 'shard' THEN 'full-data' ELSE model END
           AS model,
       avg(value) AS weight_distance, count(*) AS models
FROM metrics
WHERE metric = 'weight_distance' AND variant IS NULL
GROUP BY ALL ORDER BY method, N, model
"""


def fig4_weight_distance(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Fig. 4 layout: L2 distance from the starting weights by method, shard count and model."""
    if not has_rows(con, "metrics", "metric = 'weight_distance'"):
        return []
    df = con.sql(DISTANCE_SQL).df()
    return save_table(df, out_dir, "fig4_weight_distance",
                      "Fig. 4: L2 distance of the fine-tuned weights from their starting values (taft: ‖Δw‖)",
                      floatfmt=".4g")


REPORTS: dict = {"fig4_weight_distance": fig4_weight_distance}
