"""Reports of the privacy study (see pipeline_src/reports/report.py for the report interface).

Layouts of Liu & Soatto et al. 2024, "Tangent Transformers for Composition, Privacy and
Removal", Table 3 (DP fine-tuning):
  * privacy_table3: test accuracy of the DP model trained on the whole training split, rows
    method × regime × protocol (ours: Poisson DP-SGD; paper: the paper's App. A full-batch
    DP-GD), columns the target ε (and the method's non-private model for reference);
  * privacy_composition: DP shard models for N > 1 — the mean single shard and the Δw sum
    (taft) or ensemble (other kinds) — rows method × regime × N × model, columns ε;
  * privacy_accuracy.png: accuracy vs ε, one line per method and regime.
Rows are the `dp-*` models of `pipeline_src/steps/privacy/evaluate.py`, averaged over seeds.
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from pipeline_src.reports.claim_rows import private_selected  # noqa: E402
from pipeline_src.reports.files import has_rows, save_png  # noqa: E402
from pipeline_src.reports.files import save_table as _save_table

REGIME_ORDER = {"full": 0, "bitfit": 1, "layernorm": 2, "fc": 3}

ROWS_SQL = """
SELECT method, json_extract_string(variant, '$.regime') AS regime,
       coalesce(json_extract_string(variant, '$.protocol'), 'ours') AS protocol,
       CAST(json_extract(variant, '$.epsilon') AS DOUBLE) AS epsilon, shards AS N,
       CASE WHEN model = 'dp-shard' AND shards > 1 THEN 'shard (mean)' ELSE replace(model, 'dp-', '') END AS model,
       avg(value) AS accuracy, count(DISTINCT seed) AS seeds
FROM metrics
WHERE model LIKE 'dp-%' AND json_extract_string(variant, '$.study') = 'privacy' AND metric = 'accuracy'
  AND split = 'test'
GROUP BY ALL
"""

NONPRIVATE_SQL = """
SELECT method, avg(value) AS accuracy FROM metrics_selected
WHERE model = 'shard' AND shards = 1 AND variant IS NULL AND metric = 'accuracy' AND split = 'test'
GROUP BY ALL
"""


PRIVACY_ROWS = "model LIKE 'dp-%'"  # metrics rows of this study


def _eps_column(eps: float) -> str:
    return f"ε={eps:g}"


def _wide(df, index: list[str]):
    """One column per target ε (ascending), rows in method / regime order."""
    wide = df.pivot_table(index=index, columns="epsilon", values="accuracy").reset_index()
    eps = sorted(c for c in wide.columns if c not in index)
    wide = wide.rename(columns={e: _eps_column(e) for e in eps})
    wide.columns = [str(c) for c in wide.columns]
    return wide.sort_values(index, key=lambda c: c.map(REGIME_ORDER) if c.name == "regime" else c,
                            ignore_index=True)


def privacy_rows(con: duckdb.DuckDBPyConnection):
    """The study's accuracy rows (method, regime, protocol, epsilon, N, model, accuracy, seeds) as a DataFrame."""
    return con.sql(ROWS_SQL).df()


def _full_data_rows(con: duckdb.DuckDBPyConnection):
    """The DP models trained on the whole split (N = 1), the DP search's selected PT only."""
    df = privacy_rows(con)
    return private_selected(con, df[(df.N == 1) & (df.model == "shard")])


def privacy_table3(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Table 3 layout: DP test accuracy, rows method × regime × protocol, columns ε (N = 1); where
    the study searched, the selected points' only (DP: the PT of `private_selection`; the
    non-private column: `metrics_selected`)."""
    if not has_rows(con, "metrics", PRIVACY_ROWS):
        return []
    df = _full_data_rows(con)
    if df.empty:
        return []
    wide = _wide(df, ["method", "regime", "protocol"])
    ref = dict(con.sql(NONPRIVATE_SQL).fetchall())
    if ref:
        wide["non-private"] = [ref.get(m) for m in wide.method]
    return _save_table(wide, out_dir, "privacy_table3",
                       "DP fine-tuning (Table 3 layout): test accuracy by method, regime and protocol (rows) and "
                       "target ε (columns); protocol ours: Poisson DP-SGD, the method's loss; paper: TAFT App. A, "
                       "full-batch DP-GD, cross-entropy, taft from J·Δw only; non-private: the method's own "
                       "training, all its parameters")


def privacy_composition(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """DP shard models (N > 1): mean single shard and their Δw sum (taft) or ensemble, by ε."""
    if not has_rows(con, "metrics", PRIVACY_ROWS):
        return []
    df = privacy_rows(con)
    df = df[df.N > 1]
    if df.empty:
        return []
    wide = _wide(df, ["method", "regime", "protocol", "N", "model"])
    return _save_table(wide, out_dir, "privacy_composition",
                       "DP shard models: test accuracy of the mean shard and of their composition "
                       "(taft: Δw sum, others: ensemble), each (max ε, δ)-DP by parallel composition")


def privacy_plot(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Accuracy vs target ε (log scale) for N = 1, one line per method and regime."""
    if not has_rows(con, "metrics", PRIVACY_ROWS):
        return []
    df = _full_data_rows(con).sort_values("epsilon")
    if df.empty:
        return []
    styles = ["-", "--", "-.", ":"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {m: f"C{i}" for i, m in enumerate(sorted(df.method.unique()))}
    groups = sorted(df.groupby(["method", "regime", "protocol"]),
                    key=lambda kv: (kv[0][0], REGIME_ORDER.get(kv[0][1], 9), kv[0][2]))
    for (method, regime, protocol), g in groups:
        ax.plot(g.epsilon, g.accuracy, marker="o" if protocol == "ours" else "s", color=colors[method],
                ls=styles[REGIME_ORDER.get(regime, 0) % len(styles)],
                label=f"{method} {regime}" + ("" if protocol == "ours" else f" ({protocol})"))
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # label only the study's ε values
    ax.set_xticks(sorted(df.epsilon.unique()))
    ax.set_xticklabels([f"{e:g}" for e in sorted(df.epsilon.unique())])
    ax.set_xlabel("target ε")
    ax.set_ylabel("test accuracy")
    ax.set_title("DP fine-tuning: accuracy vs ε (whole training split)")
    ax.legend(fontsize=7, ncol=2)
    png = save_png(fig, out_dir / "privacy_accuracy.png")
    return [png]


REPORTS: dict = {"privacy_table3": privacy_table3, "privacy_composition": privacy_composition,
                 "privacy_plot": privacy_plot}
