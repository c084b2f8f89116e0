"""The validation search's choices, laid out like the TAFT paper's Tables 4-6 (App. A).

`search_selection.{md,csv}`: one row per searched method and shard count N: the selected grid
point (LR, and PT, CLS for taft), the model compared (the full-data model at N = 1, else the
soup), its validation accuracy, and its test accuracy, the one test figure of the search: that of
the method's own models, which train at the selected point (`plan/selected_point.py`; the grid
points are validated only); every candidate's validation accuracy; and the point
the paper chose for that kind and setting (its ViT-L/16 on seven datasets, for comparison). Rows from
the `selection` view (`steps/select.py`) and, for the selected point's test accuracy, `metrics`.
(`trained_points`, `reports/trained_points.py`, says which point every N trained at.)
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

from pipeline_src.reports.files import has_rows, save_table

# The points the TAFT paper chose (App. A, Tables 4-6, ViT-L/16 on ImageNet; design.md section 9),
# by (kind, full data or shards); k > 1 is Table 5's 7 blocks. full and last are not in its tables.
PAPER_CHOICE = {
    ("fc", "full"): "Table 4: LR 1e-3 (MIT, Pets, CUB, Cars, Aircraft) or 1e-4 (Caltech, Dogs)",
    ("nlft", "full"): "Table 4: LR 1e-4 on all 7, CLS = T on CUB, Cars and Aircraft",
    ("taft", "full"): "Table 4: LR 1e-3 (1e-4 on Dogs), PT = F (T on Dogs), CLS = T on Cars and Aircraft",
    ("nlft", "full", "deep"): "Table 5 (7 blocks): LR 1e-4",
    ("taft", "full", "deep"): "Table 5 (7 blocks): LR 1e-4, PT = T, CLS = F (T on Aircraft)",
    ("nlft", "shards"): "Table 6: LR 1e-3",
    ("taft", "shards"): "Table 6: LR 1e-3, PT = F, CLS = T on Cars and Aircraft",
}


def paper_choice(kind: str, k: int | None, shards: int) -> str:
    """The paper's chosen point for a method of this kind and k at N shards ('' where it has none)."""
    setting = "full" if shards == 1 else "shards"
    deep = ("deep",) if k is not None and k > 1 and setting == "full" else ()
    return PAPER_CHOICE.get((kind, setting, *deep), "")

SELECTION_SQL = """
WITH chosen AS (SELECT * FROM selection WHERE selected),
test AS (
  SELECT method, shards, model, avg(value) AS test_accuracy, count(DISTINCT seed) AS test_seeds
  FROM metrics WHERE metric = 'accuracy' AND split = 'test' AND variant IS NULL
    AND ((model = 'shard' AND shards = 1 AND shard_id = 0) OR model <> 'shard')
  GROUP BY ALL),
tried AS (
  SELECT method, shards, string_agg(candidate || ' ' || printf('%.4f', val_accuracy), '; ' ORDER BY candidate)
         AS candidates_val
  FROM selection GROUP BY ALL)
SELECT c.method, c.kind, c.k, c.shards AS N, c.model, c.candidate AS selected,
       printf('%g', c.lr) AS LR,
       CASE WHEN c.pt IS NULL THEN '' WHEN c.pt THEN 'T' ELSE 'F' END AS PT,
       CASE WHEN c.cls IS NULL THEN '' WHEN c.cls THEN 'T' ELSE 'F' END AS CLS,
       c.val_accuracy, t.test_accuracy, c.seeds, tr.candidates_val
FROM chosen c
LEFT JOIN test t ON t.method = c.method AND t.shards = c.shards AND t.model = c.model
JOIN tried tr ON tr.method = c.method AND tr.shards = c.shards
ORDER BY c.method, c.shards
"""


def selection_report(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Write `search_selection.{md,csv}` when the study ran the validation search."""
    if not has_rows(con, "selection", "true") or not has_rows(con, "metrics", "true"):
        return []
    df = con.sql(SELECTION_SQL).df()
    df["paper's choice"] = [paper_choice(kind, None if pd.isna(k) else int(k), n)
                            for kind, k, n in zip(df.kind, df.k, df.N)]
    df = df.drop(columns=["kind", "k"])
    return save_table(df, out_dir, "search_selection",
                      "Validation search: the selected point per method and N (TAFT Tables 4-6); test accuracy "
                      "of the selected point only", blank_missing=True)


PRIVATE_SQL = """
WITH chosen AS (SELECT * FROM private_selection WHERE selected),
test AS (
  SELECT method, shards, json_extract_string(variant, '$.protocol') AS protocol,
         json_extract_string(variant, '$.regime') AS regime, CAST(json_extract(variant, '$.epsilon') AS DOUBLE) AS epsilon,
         avg(value) AS test_accuracy
  FROM metrics WHERE metric = 'accuracy' AND split = 'test' AND json_extract_string(variant, '$.study') = 'privacy'
    AND ((model = 'dp-shard' AND shards = 1 AND shard_id = 0) OR model = 'dp-soup')
  GROUP BY ALL),
tried AS (
  SELECT method, shards, protocol, regime, epsilon,
         string_agg(candidate || ' ' || printf('%.4f', val_accuracy), '; ' ORDER BY candidate) AS candidates_val
  FROM private_selection GROUP BY ALL)
SELECT c.protocol, c.method, c.regime, c.epsilon AS "ε", c.shards AS N, c.candidate AS selected,
       CASE WHEN c.pt THEN 'T' ELSE 'F' END AS PT, c.val_accuracy, t.test_accuracy, c.seeds, tr.candidates_val
FROM chosen c
LEFT JOIN test t ON t.method = c.candidate AND t.shards = c.shards AND t.protocol = c.protocol
  AND t.regime = c.regime AND t.epsilon = c.epsilon
JOIN tried tr ON tr.method = c.method AND tr.shards = c.shards AND tr.protocol = c.protocol
  AND tr.regime = c.regime AND tr.epsilon = c.epsilon
ORDER BY c.protocol, c.method, c.regime, c.epsilon, c.shards
"""


def private_selection_report(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Write `search_selection_private.{md,csv}` when the privacy study ran the DP search (PT)."""
    if not has_rows(con, "private_selection", "true") or not has_rows(con, "metrics", "true"):
        return []
    return save_table(con.sql(PRIVATE_SQL).df(), out_dir, "search_selection_private",
                      "DP search: the selected PT per protocol, method, regime and ε (the paper searched PT ∈ {T, F}); "
                      "test accuracy of the selected point only", blank_missing=True)


REPORTS: dict = {"search_selection": selection_report, "search_selection_private": private_selection_report}
