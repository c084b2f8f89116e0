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


ABLATION_SQL = """
SELECT method, json_extract_string(variant, '$.figure') AS figure, json_extract_string(variant, '$.point') AS point,
       json_extract_string(variant, '$.loss') AS loss,
       CASE WHEN json_extract(variant, '$.reset')::BOOLEAN THEN 'F' ELSE 'T' END AS PT,
       CASE WHEN json_extract(variant, '$.reset_cls')::BOOLEAN THEN 'T' ELSE 'F' END AS CLS,
       json_extract(variant, '$.radius')::DOUBLE AS radius, json_extract(variant, '$.l2')::DOUBLE AS l2,
       avg(value) FILTER (WHERE metric = 'accuracy') AS accuracy,
       avg(value) FILTER (WHERE metric = 'weight_distance') AS weight_distance,
       count(DISTINCT seed) AS seeds
FROM metrics WHERE model = 'ablation' AND json_extract_string(variant, '$.study') = 'ablation'
GROUP BY ALL ORDER BY ALL
"""


def taft_ablations(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Fig. 2 (accuracy by loss × PT × CLS) and Table 12 (accuracy and ‖Δw‖ by radius R × l2)."""
    if not has_rows(con, "metrics", "model = 'ablation'"):
        return []
    df = con.sql(ABLATION_SQL).df()
    paths = []
    fig2 = df[df.figure == "fig2"][["method", "loss", "PT", "CLS", "accuracy", "weight_distance", "seeds"]]
    if not fig2.empty:
        paths += save_table(fig2, out_dir, "fig2_ablation", "Fig. 2: TAFT test accuracy by loss, PT (pretrained "
                            "linearization point) and CLS (linearized CLS token)", floatfmt=".4g")
    t12 = df[df.figure == "table12"].copy()
    if not t12.empty:
        t12["radius"] = t12.radius.map(lambda r: "none" if r != r else f"{r:g}")  # NaN: no projection
        wide = t12.pivot_table(index=["method", "radius"], columns="l2", values="accuracy").reset_index()
        wide.columns = [c if isinstance(c, str) else f"l2={c:g}" for c in wide.columns]
        paths += save_table(wide, out_dir, "table12_radius", "Table 12: TAFT test accuracy by PGD radius R (rows) "
                            "and L2 weight on ‖Δw‖² (columns)", floatfmt=".4g")
    return paths


REPORTS["taft_ablations"] = taft_ablations
