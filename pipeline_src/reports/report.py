"""Study reports: DuckDB queries over the results views → Markdown, CSV and PNG.

The accuracy tables read `metrics_selected` (`store/results_db.py`): where the study ran the
validation search, each searched method's selected grid point only, under the method's name.

Each report is a function `(con, out_dir) -> list[Path]` in `REPORTS` (those in `WITH_CONFIG`
also take `config=`, the study's config); the `report` rule runs them all, and
`python -m pipeline_src.store.query` runs ad-hoc SQL over the same views.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import duckdb
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pipeline_src.reports.files import save_png  # noqa: E402
from pipeline_src.reports.files import save_table as _save_table  # noqa: E402

ACCURACY_SQL = """
SELECT method, any_value(kind) AS kind, shards,
       CASE WHEN model = 'shard' AND shards > 1 THEN 'shard-mean' WHEN model = 'shard' THEN 'full-data' ELSE model END AS model,
       avg(value) AS accuracy, count(*) AS models, count(DISTINCT seed) AS seeds
FROM metrics_selected
WHERE metric = 'accuracy' AND split = 'test' AND kind <> 'pretrain' AND variant IS NULL
GROUP BY ALL
ORDER BY method, shards, model
"""


def accuracy_report(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Test accuracy per method and shard count: full data, mean single shard, soup, ensemble."""
    df = con.sql(ACCURACY_SQL).df()
    paths = _save_table(df, out_dir, "accuracy", "Test accuracy by method, shard count and composition")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (method, model), g in df[df.model != "full-data"].groupby(["method", "model"]):
        ax.plot(g.shards, g.accuracy, marker="o", label=f"{method} {model}")
    for _, row in df[df.model == "full-data"].iterrows():
        ax.axhline(row.accuracy, ls=":", lw=1, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("shards (N)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Accuracy vs shard count (dotted: full-data models)")
    ax.legend(fontsize=7, ncol=2)
    png = save_png(fig, out_dir / "accuracy.png")
    return paths + [png]


def _pivot_report(con, out_dir: Path, stem: str, title: str, sql: str) -> list[Path]:
    df = con.sql(sql).df()
    if df.empty:
        return []
    wide = df.pivot_table(index=df.columns[0], columns=df.columns[1], values=df.columns[2]).reset_index()
    wide.columns = [str(c) for c in wide.columns]
    return _save_table(wide, out_dir, stem, title)


TABLE1_SQL = """
WITH per_seed AS (
    SELECT method, any_value(kind) AS kind, seed, avg(value) AS accuracy
    FROM metrics_selected
    WHERE metric = 'accuracy' AND split = 'test' AND shards = 1 AND model = 'shard' AND kind <> 'pretrain'
      AND (variant IS NULL OR kind = 'baseline')  -- a reference's variant records its own choice (pixel-logreg: C)
    GROUP BY method, seed)
SELECT method, avg(accuracy) AS accuracy, stddev_samp(accuracy) AS sd, count(*) AS seeds, any_value(kind) AS kind
FROM per_seed
GROUP BY method
ORDER BY list_position(['fc', 'nlft', 'taft', 'full', 'last', 'baseline'], any_value(kind)) NULLS LAST, method
"""


def taft_table1(con, out_dir: Path) -> list[Path]:
    """The TAFT paper's Table 1 layout: full-data test accuracy of every method in its order (FC,
    NLFT-k, TAFT-k, full fine-tuning, then LAST and the references that need no pretraining), the
    mean over seeds and the sample sd of the per-seed accuracies (empty below two seeds)."""
    df = con.sql(TABLE1_SQL).df()
    if df.empty:
        return []
    return _save_table(df, out_dir, "table1_methods", "Table 1: test accuracy of models trained on the full training set")


def taft_table2(con, out_dir: Path) -> list[Path]:
    """The TAFT paper's Table 2 layout: composed-model accuracy per shard count (soup for
    non-linear methods, Δw composition for taft)."""
    return _pivot_report(con, out_dir, "table2_composition", "Table 2: accuracy of the composed model by shard count", """
        SELECT method || CASE WHEN kind = 'taft' THEN ' (Δw sum)' ELSE ' (soup)' END AS composed, 'N=' || shards AS shards,
               avg(value) AS accuracy
        FROM metrics_selected WHERE metric = 'accuracy' AND split = 'test' AND kind <> 'pretrain' AND variant IS NULL
          AND (model = 'soup' OR (model = 'shard' AND shards = 1)) GROUP BY ALL""")


def _all_reports() -> dict[str, Callable[[duckdb.DuckDBPyConnection, Path], list[Path]]]:
    from pipeline_src.reports import ablations as report_ablations
    from pipeline_src.reports import benchmarks as report_benchmarks
    from pipeline_src.reports import claims as report_claims
    from pipeline_src.reports import efficiency as report_efficiency
    from pipeline_src.reports import fusion as report_fusion
    from pipeline_src.reports import last_grid as report_last
    from pipeline_src.reports import privacy as report_privacy
    from pipeline_src.reports import selection as report_selection
    from pipeline_src.reports import trained_points as report_trained
    from pipeline_src.reports import unlearning as report_unlearning

    reports = {**report_claims.REPORTS, "accuracy": accuracy_report, "table1": taft_table1, "table2": taft_table2}
    for extra in (report_fusion.REPORTS, report_privacy.REPORTS, report_unlearning.REPORTS, report_last.REPORTS,
                  report_benchmarks.REPORTS, report_ablations.REPORTS, report_efficiency.REPORTS, report_selection.REPORTS,
                  report_trained.REPORTS):
        clash = set(reports) & set(extra)
        if clash:
            raise ValueError(f"report names registered twice: {sorted(clash)}")
        reports.update(extra)
    return reports


REPORTS = _all_reports()
WITH_CONFIG = {"claims"}  # reports that also take the study's config (`config=`)
