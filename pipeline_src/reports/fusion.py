"""Reports of the fusion study (see pipeline_src/reports/report.py for the report interface).

Layouts of Zhang et al., "Beyond the Permutation Symmetry of Transformers: The Role of
Rotation for Model Fusion", ICML 2025:
  * Table 2: test accuracy of each fusion method (soup, Fisher, RegMean) without and with each
    kind of matching, per method, shard count and init; the mean single shard model for reference
    (equal in every column, since matching keeps each model's function);
  * Figure 3: distance of the shard models to the anchor (shard 0) before (`none`) and after
    each kind of matching.
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pipeline_src.plan.fusion import MATCHINGS  # noqa: E402
from pipeline_src.reports.files import has_rows, save_png  # noqa: E402
from pipeline_src.reports.files import save_table as _save_table

ROWS_SQL = """
SELECT method, shards AS N, json_extract_string(variant, '$.init') AS init,
       CASE WHEN model = 'fusion-shard' THEN 'shard (mean)' ELSE replace(model, 'fusion-', '') END AS fusion,
       json_extract_string(variant, '$.matching') AS matching, metric, avg(value) AS value, count(*) AS rows
FROM metrics
WHERE model LIKE 'fusion-%' AND json_extract_string(variant, '$.study') = 'fusion' AND metric IN ({metrics})
GROUP BY ALL
"""


FUSION_ROWS = "model LIKE 'fusion-%'"  # metrics rows of this study


def _wide(df, index: list[str]):
    """One column per matching kind, in the study's order."""
    wide = df.pivot_table(index=index, columns="matching", values="value").reset_index()
    wide.columns = [str(c) for c in wide.columns]
    return wide[index + [m for m in MATCHINGS if m in wide.columns]]


def fusion_table2(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Table 2 layout: fused-model test accuracy by fusion method (rows) and matching (columns)."""
    if not has_rows(con, "metrics", FUSION_ROWS):
        return []
    df = con.sql(ROWS_SQL.format(metrics="'accuracy'")).df()
    if df.empty:
        return []
    order = {"shard (mean)": 0, "soup": 1, "fisher": 2, "regmean": 3}
    wide = _wide(df, ["method", "N", "init", "fusion"])
    wide = wide.sort_values(["method", "N", "init", "fusion"], key=lambda c: c.map(order) if c.name == "fusion" else c)
    return _save_table(wide, out_dir, "fusion_table2",
                       "Fusion (Table 2 layout): test accuracy of the fused model, without and with matching to shard 0")


def fusion_figure3(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Figure 3: mean parameter distance of shard models to the anchor after each matching kind."""
    if not has_rows(con, "metrics", FUSION_ROWS):
        return []
    df = con.sql(ROWS_SQL.format(metrics="'anchor_distance', 'anchor_distance_matchable'")).df()
    if df.empty:
        return []
    paths = []
    for metric, part in df.groupby("metric"):
        wide = _wide(part, ["method", "N", "init"]).sort_values(["method", "N", "init"])
        paths += _save_table(wide, out_dir, f"fusion_{metric}",
                             f"Distance to the anchor (shard 0) after matching: {metric} (mean over shards 1..N-1)")
    wide = _wide(df[df.metric == "anchor_distance"], ["method", "N", "init"]).sort_values(["method", "N", "init"])
    matchings = [m for m in MATCHINGS if m in wide.columns]
    labels = [f"{r.method}\n{r.init}\nN={r.N}" for r in wide.itertuples()]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(labels)), 4.5))
    width = 0.8 / len(matchings)
    for j, matching in enumerate(matchings):
        xs = [i + (j - (len(matchings) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, wide[matching], width=width, label="no matching" if matching == "none" else matching)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("‖θ_i − θ_anchor‖₂ (trained parameters)")
    ax.set_title("Distance to the anchor after matching (Figure 3 layout)", fontsize=10)
    ax.legend(fontsize=8)
    png = save_png(fig, out_dir / "fusion_figure3.png")
    return paths + [png]


REPORTS: dict = {"fusion_table2": fusion_table2, "fusion_figure3": fusion_figure3}
