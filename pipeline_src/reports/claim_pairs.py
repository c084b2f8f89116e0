"""The per-image pairs behind the study claims' paired tests (`reports/claims.py`): unlearning,
DP and fusion.

Each query joins two methods' (or two settings') per-image records (`per_image` view,
`store/per_image.py`) on the seed, the test image and the settings that make the two models a
pair, and returns one row per seed, case and image: `d` = correct_T − correct_F (−1, 0 or 1;
for the unlearning study already averaged over the requests of one removed-shard count). The
cases are what the claim averages over: the removed-shard counts r of the unlearning study, the
regimes of the DP study, none for fusion. `seed_differences` averages each image's d over the
cases, the paired differences `paired_bootstrap.paired_bootstrap_gaps` resamples.
"""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from pipeline_src.reports.claim_rows import views

# Subtract (T) against SISA drop (F) per seed, removed-shard count r ≥ 1 and request: the same
# random shard set is removed from both (`steps/forget/drop.py`); averaged over requests per r.
DROP_PAIRS_SQL = """
WITH d AS (
  SELECT method, model, shards, seed, sample_id, correct,
         CAST(json_extract(variant, '$.removed_shards') AS INTEGER) AS removed,
         CAST(json_extract(variant, '$.request') AS INTEGER) AS request
  FROM per_image WHERE split = 'test' AND model IN ('subtract', 'sisa-drop'))
SELECT t.seed, t.removed AS "case", t.sample_id, avg(t.correct::INTEGER - f.correct::INTEGER) AS d
FROM d t JOIN d f ON f.method = $f AND f.model = 'sisa-drop' AND f.shards = t.shards AND f.seed = t.seed
  AND f.removed = t.removed AND f.request = t.request AND f.sample_id = t.sample_id
WHERE t.method = $t AND t.model = 'subtract' AND t.shards = $shards AND t.removed > 0
GROUP BY ALL ORDER BY ALL
"""

# The DP models at N = 1 of one protocol and ε (`steps/privacy/evaluate.py`), as `claim_rows.PRIVACY_SQL`.
DP_IMAGES_SQL = """
SELECT method, json_extract_string(variant, '$.regime') AS regime,
       coalesce(json_extract_string(variant, '$.protocol'), 'ours') AS protocol,
       CAST(json_extract(variant, '$.epsilon') AS DOUBLE) AS epsilon, seed, sample_id, correct
FROM per_image
WHERE model = 'dp-shard' AND shards = 1 AND split = 'test' AND json_extract_string(variant, '$.study') = 'privacy'
"""

# Where the DP search ran, its selected PT point's records under the searched method's name and the
# other point's left out, as `claim_rows.private_selected` does with the metrics.
DP_SELECTED_SQL = """
SELECT coalesce(s.method, dp.method) AS method, dp.regime, dp.protocol, dp.epsilon, dp.seed, dp.sample_id, dp.correct
FROM dp LEFT JOIN (SELECT method, candidate, protocol, regime, epsilon, selected FROM private_selection
                   WHERE shards = 1) s
  ON s.candidate = dp.method AND s.protocol = dp.protocol AND s.regime = dp.regime AND s.epsilon = dp.epsilon
WHERE s.selected IS NULL OR s.selected
"""

DP_PAIRS_SQL = """
WITH dp AS ({images}), chosen AS ({selected})
SELECT t.seed, t.regime AS "case", t.sample_id, t.correct::INTEGER - f.correct::INTEGER AS d
FROM chosen t JOIN chosen f ON f.method = $f AND f.protocol = t.protocol AND f.epsilon = t.epsilon
  AND f.regime = t.regime AND f.seed = t.seed AND f.sample_id = t.sample_id
WHERE t.method = $t AND t.protocol = $protocol AND t.epsilon = $epsilon
ORDER BY ALL
"""

# The fusion study's soups (`steps/fusion/fuse.py`) after matching (T) and without (F).
FUSION_PAIRS_SQL = """
WITH s AS (
  SELECT method, shards, seed, sample_id, correct, json_extract_string(variant, '$.init') AS init,
         json_extract_string(variant, '$.matching') AS matching
  FROM per_image WHERE split = 'test' AND model = 'fusion-soup' AND json_extract_string(variant, '$.study') = 'fusion')
SELECT t.seed, '' AS "case", t.sample_id, t.correct::INTEGER - f.correct::INTEGER AS d
FROM s t JOIN s f ON f.method = t.method AND f.shards = t.shards AND f.init = t.init AND f.matching = 'none'
  AND f.seed = t.seed AND f.sample_id = t.sample_id
WHERE t.method = $method AND t.shards = $shards AND t.init = $init AND t.matching = $matched
ORDER BY ALL
"""

COLUMNS = ["seed", "case", "sample_id", "d"]


def _pairs(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> pd.DataFrame:
    if "per_image" not in views(con):
        return pd.DataFrame(columns=COLUMNS)
    return con.execute(sql, params).df()


def drop_pairs(con: duckdb.DuckDBPyConnection, t: str, f: str, shards: int) -> pd.DataFrame:
    """seed, case (removed-shard count r ≥ 1), sample_id, d: T's subtract against F's SISA drop at
    N = `shards`, averaged over the requests both have per r; empty without per-image records."""
    return _pairs(con, DROP_PAIRS_SQL, {"t": t, "f": f, "shards": shards})


def dp_pairs(con: duckdb.DuckDBPyConnection, t: str, f: str, protocol: str, epsilon: float) -> pd.DataFrame:
    """seed, case (regime), sample_id, d: T's DP model against F's at N = 1, one protocol and ε, in
    every regime both have (the selected PT point where the DP search ran); empty without records."""
    selected = DP_SELECTED_SQL if "private_selection" in views(con) else "SELECT * FROM dp"
    sql = DP_PAIRS_SQL.format(images=DP_IMAGES_SQL, selected=selected)
    return _pairs(con, sql, {"t": t, "f": f, "protocol": protocol, "epsilon": float(epsilon)})


def fusion_pairs(con: duckdb.DuckDBPyConnection, method: str, shards: int, init: str, matched: str) -> pd.DataFrame:
    """seed, case (empty), sample_id, d: the fusion study's soup after matching `matched` against
    the soup without matching; empty without per-image records."""
    return _pairs(con, FUSION_PAIRS_SQL, {"method": method, "shards": shards, "init": init, "matched": matched})


def seed_differences(pairs: pd.DataFrame) -> list[np.ndarray]:
    """Per seed (in seed order), each test image's d averaged over the cases: (images,) arrays.

    Args:
        pairs: rows of `COLUMNS` (one seed, case and image each).
    Raises:
        ValueError: an image of a seed lacks a case that seed's other images have (the averages
            would weigh the cases differently per image).
    """
    out = []
    for seed, g in pairs.groupby("seed", sort=True):
        cases = g.groupby("sample_id")["case"].nunique()
        if cases.min() != g["case"].nunique():
            raise ValueError(f"paired per-image records of seed {seed}: {int((cases < g['case'].nunique()).sum())} "
                             f"image(s) lack some of the cases {sorted(g['case'].unique())}")
        out.append(g.groupby("sample_id")["d"].mean().to_numpy(dtype=np.float64))
    return out
