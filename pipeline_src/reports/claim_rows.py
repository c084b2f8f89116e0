"""The rows the claims table compares (`reports/claims.py`), read from the DuckDB views.

Every query returns a DataFrame, empty when its view is absent (no such files yet) or holds no
matching row. Accuracies are test accuracies (metric `accuracy`, split `test`), averaged over
seeds; the unlearning rows stay per request, to be paired by the claims.
"""
from __future__ import annotations

import json

import duckdb
import pandas as pd

# Full-data models (model `shard`, N = 1) and soups (N > 1) of the main DAG (no study variant);
# where the study searched, the selected grid point's (`metrics_selected`, store/results_db.py).
ACCURACY_SQL = """
SELECT method, any_value(kind) AS kind, model, shards, avg(value) AS accuracy, count(DISTINCT seed) AS seeds
FROM metrics_selected
WHERE metric = 'accuracy' AND split = 'test' AND variant IS NULL AND kind <> 'pretrain'
  AND ((model = 'shard' AND shards = 1) OR model = 'soup')
GROUP BY method, model, shards
"""

# Per seed, the paired per-image counts of two methods' models at one model and N (the same test
# images, joined on sample_id): images, T right & F wrong, T wrong & F right (`reports/paired_bootstrap.py`).
PAIRED_COUNTS_SQL = """
SELECT t.seed, count(*) AS images, count(*) FILTER (WHERE t.correct AND NOT f.correct) AS t_only,
       count(*) FILTER (WHERE f.correct AND NOT t.correct) AS f_only
FROM per_image_selected t JOIN per_image_selected f
  ON t.seed = f.seed AND t.sample_id = f.sample_id AND t.model = f.model AND t.shards = f.shards
 AND f.split = 'test' AND f.variant IS NULL AND f.method = $f
WHERE t.split = 'test' AND t.variant IS NULL AND t.method = $t AND t.model = $model AND t.shards = $shards
GROUP BY t.seed ORDER BY t.seed
"""

# Forgetting by dropping shards (`steps/forget/drop.py`), per request; r = 0 (nothing removed) left out.
DROP_SQL = """
SELECT method, model, shards, seed, CAST(json_extract(variant, '$.removed_shards') AS INTEGER) AS removed,
       CAST(json_extract(variant, '$.request') AS INTEGER) AS request, value AS accuracy
FROM metrics
WHERE metric = 'accuracy' AND model IN ('subtract', 'sisa-drop')
  AND CAST(json_extract(variant, '$.removed_shards') AS INTEGER) > 0
"""

# Retrain-shard and the same-method paragon (`steps/forget/{retrain,paragon}.py`), per request.
RETRAIN_SQL = """
SELECT method, model, shards, seed, CAST(json_extract(variant, '$.fraction') AS DOUBLE) AS fraction,
       CAST(json_extract(variant, '$.request') AS INTEGER) AS request,
       any_value(value) FILTER (WHERE metric = 'unlearn_time_s') AS unlearn_time_s,
       any_value(value) FILTER (WHERE metric = 'affected_shards') AS affected_shards
FROM metrics
WHERE model IN ('retrain-shard', 'paragon') AND metric IN ('unlearn_time_s', 'affected_shards')
GROUP BY ALL
"""

# DP models on the whole training split (`steps/privacy/evaluate.py`), as in `reports/privacy.py`.
PRIVACY_SQL = """
SELECT method, json_extract_string(variant, '$.regime') AS regime,
       coalesce(json_extract_string(variant, '$.protocol'), 'ours') AS protocol,
       CAST(json_extract(variant, '$.epsilon') AS DOUBLE) AS epsilon, avg(value) AS accuracy
FROM metrics
WHERE model = 'dp-shard' AND shards = 1 AND json_extract_string(variant, '$.study') = 'privacy'
  AND metric = 'accuracy' AND split = 'test'
GROUP BY ALL
"""

# Soups of the fusion study without and with matching (`steps/fusion/fuse.py`), as in `reports/fusion.py`.
FUSION_SQL = """
SELECT method, shards, json_extract_string(variant, '$.init') AS init,
       json_extract_string(variant, '$.matching') AS matching, avg(value) AS accuracy, count(DISTINCT seed) AS seeds
FROM metrics
WHERE model = 'fusion-soup' AND json_extract_string(variant, '$.study') = 'fusion' AND metric = 'accuracy'
GROUP BY ALL
"""

# Training memory of the full-data models, from their records (`steps/train.py`): `train_mem_mb`
# counts tensors as the LAST paper's Table 7 does (`job/training_memory.py`), `peak_mem_mb` is the
# job's CUDA max allocated or process max RSS.
MEMORY_SQL = """
SELECT method, avg(peak_mem_mb) AS peak_mem_mb, avg({counted}) AS train_mem_mb,
       string_agg(DISTINCT device, ', ') AS device
FROM models
WHERE kind = 'trained' AND shards = 1 AND peak_mem_mb IS NOT NULL
GROUP BY method
"""


def views(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The names of the connection's views (a view whose files do not exist yet is absent)."""
    return {r[0] for r in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}


def _query(con: duckdb.DuckDBPyConnection, view: str, sql: str) -> pd.DataFrame:
    return con.sql(sql).df() if view in views(con) else pd.DataFrame()


def accuracy_rows(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """method, kind, model (`shard` at N = 1, `soup`), shards, accuracy, seeds."""
    return _query(con, "metrics", ACCURACY_SQL)


def paired_counts(con: duckdb.DuckDBPyConnection, t: str, f: str, model: str,
                  shards: int) -> list[tuple[int, int, int]]:
    """Per seed both methods have, (images, T-only right, F-only right) of their `model` at N =
    `shards` over the test images they share; empty without per-image records."""
    if "per_image_selected" not in views(con):
        return []
    rows = con.execute(PAIRED_COUNTS_SQL, {"t": t, "f": f, "model": model, "shards": shards}).fetchall()
    return [(int(n), int(a), int(b)) for _, n, a, b in rows]


def selected_points(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, int], str]:
    """(searched method, N) -> its selected point in words ('taft-1_lr1e-4_ptF_clsT: LR 1e-4, PT F,
    CLS T, val 85.1 %'); empty without a search (`selection` view, `steps/select.py`)."""
    if "selection" not in views(con):
        return {}
    rows = con.sql("SELECT method, shards, candidate, lr, pt, cls, val_accuracy FROM selection WHERE selected").fetchall()
    out = {}
    for method, n, candidate, lr, pt, cls, val in rows:
        axes = [f"LR {lr:g}"] + ([f"PT {'T' if pt else 'F'}"] if pt is not None else []) + (
            [f"CLS {'T' if cls else 'F'}"] if cls is not None else [])
        out[method, int(n)] = f"{candidate}: {', '.join(axes)}, val {100 * val:.1f} %"
    if "models" in views(con):  # an N the search did not run at trains at a searched N's choice
        trained = con.sql("""SELECT DISTINCT method, shards,
                CAST(json_extract(to_json(method_config), '$.selected.chosen_at_shards') AS BIGINT) AS chosen
            FROM models WHERE kind = 'trained'
              AND json_extract_string(to_json(method_config), '$.selected.candidate') IS NOT NULL""").fetchall()
        for method, n, chosen in trained:
            if (method, int(n)) not in out and (method, int(chosen)) in out:
                out[method, int(n)] = f"{out[method, int(chosen)]} (chosen at N = {int(chosen)})"
    return out


def drop_rows(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """method, model (`subtract` / `sisa-drop`), shards, seed, removed (≥ 1), request, accuracy."""
    return _query(con, "metrics", DROP_SQL)


def retrain_rows(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """method, model (`retrain-shard` / `paragon`), shards, seed, fraction, request, unlearn_time_s,
    affected_shards (NULL for the paragon)."""
    return _query(con, "metrics", RETRAIN_SQL)


def privacy_rows(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """method, regime, protocol, epsilon, accuracy of the DP models at N = 1 (the selected PT where
    the study ran the DP search)."""
    return private_selected(con, _query(con, "metrics", PRIVACY_SQL))


def private_selected(con: duckdb.DuckDBPyConnection, rows: pd.DataFrame) -> pd.DataFrame:
    """DP rows as the DP search selected them: per protocol, searched method, regime and ε, the
    selected PT point's rows under the method's name; the other point's rows left out."""
    if rows.empty or "private_selection" not in views(con):
        return rows
    sel = con.sql("SELECT method AS base, candidate, protocol, regime, epsilon, selected FROM private_selection "
                  "WHERE shards = 1").df()
    rows = rows.merge(sel.rename(columns={"candidate": "method"}), how="left",
                      on=["method", "protocol", "regime", "epsilon"])
    rows = rows[rows.selected.isna() | (rows.selected == True)]  # noqa: E712 (a pandas mask)
    rows = rows.assign(method=rows.base.where(rows.base.notna(), rows.method))
    return rows.drop(columns=["base", "selected"])


def fusion_rows(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """method, shards, init, matching, accuracy (mean over seeds), seeds of the fusion study's soups."""
    return _query(con, "metrics", FUSION_SQL)


def memory_rows(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """method, peak_mem_mb and train_mem_mb (means over seeds; train_mem_mb NULL where the records
    lack it), device(s) of the N = 1 training jobs whose records carry `peak_mem_mb` (records
    written before it was recorded do not)."""
    if "models" not in views(con):
        return pd.DataFrame()
    columns = {r[0] for r in con.sql("DESCRIBE models").fetchall()}
    if not {"peak_mem_mb", "shards", "device"} <= columns:
        return pd.DataFrame()
    return con.sql(MEMORY_SQL.format(counted="train_mem_mb" if "train_mem_mb" in columns else "NULL")).df()


def recorded_methods(con: duckdb.DuckDBPyConnection) -> dict[str, dict]:
    """Each trained method's settings (`method_config` of its records), by name: what the claims
    use when no config is given."""
    if "models" not in views(con):
        return {}
    rows = con.sql("SELECT method, to_json(any_value(method_config)) FROM models WHERE kind = 'trained' "
                   "GROUP BY method ORDER BY method").fetchall()
    return {name: {k: v for k, v in json.loads(cfg).items() if v is not None} for name, cfg in rows}
