"""Reports of the unlearning study (see pipeline_src/reports/report.py for the report interface).

- `unlearning_drop`: accuracy vs number of shards removed, TAFT-subtract vs SISA-drop, averaged
  over random requests (Figure 1a/b of Liu, Soatto et al., "Tangent Transformers for
  Composition, Privacy and Removal", ICLR 2024).
- `unlearning_retrain`: accuracy and wall time of retrain-shard (and SISA's retrained ensemble)
  vs the paragons as the forgotten fraction grows (their Figure 1c and Figure 3; SISA: Bourtoule
  et al., "Machine Unlearning", IEEE S&P 2021), with the speed-up against each paragon: the
  same-method retrain (`paragon`) and the paper's, retraining the non-linear model
  (`paragon-nonlinear`, their App. C.3; for a non-linear method its own retrain).
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pipeline_src.reports.files import plain_log_ticks  # noqa: E402
from pipeline_src.reports.files import save_png as _savefig  # noqa: E402
from pipeline_src.reports.files import save_table as _save

DROP_SQL = """
SELECT method, model AS strategy, shards,
       CAST(json_extract_string(variant, '$.removed_shards') AS INTEGER) AS removed_shards,
       avg(value) AS accuracy, stddev_samp(value) AS accuracy_std, count(*) AS requests
FROM metrics
WHERE metric = 'accuracy' AND model IN ('subtract', 'sisa-drop')
GROUP BY ALL ORDER BY method, shards, removed_shards
"""

RETRAIN_SQL = """
WITH rows AS (
    SELECT method, model AS strategy, shards, metric, value,
           CAST(json_extract_string(variant, '$.fraction') AS DOUBLE) AS fraction
    FROM metrics WHERE model IN ('retrain-shard', 'sisa-retrain', 'paragon', 'paragon-nonlinear')
), points AS (
    SELECT method, strategy, shards, fraction,
           avg(value) FILTER (WHERE metric = 'accuracy') AS accuracy,
           avg(value) FILTER (WHERE metric = 'unlearn_time_s') AS unlearn_time_s,
           avg(value) FILTER (WHERE metric = 'affected_shards') AS affected_shards,
           count(*) FILTER (WHERE metric = 'accuracy') AS requests
    FROM rows GROUP BY ALL
)
SELECT p.*, par.unlearn_time_s / p.unlearn_time_s AS speedup_vs_paragon,
       coalesce(nl.unlearn_time_s, par.unlearn_time_s) / p.unlearn_time_s AS speedup_vs_nonlinear_paragon
FROM points p
LEFT JOIN points par ON par.strategy = 'paragon' AND par.method = p.method AND par.fraction = p.fraction
LEFT JOIN points nl ON nl.strategy = 'paragon-nonlinear' AND nl.method = p.method AND nl.fraction = p.fraction
ORDER BY method, strategy, shards, fraction
"""


def unlearning_drop(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Accuracy vs shards removed without retraining: TAFT-subtract vs SISA-drop."""
    df = con.sql(DROP_SQL).df()
    if df.empty:
        return []
    paths = _save(df, out_dir, "unlearning_drop", "Unlearning without retraining: accuracy vs shards removed")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for (method, strategy, n), g in df.groupby(["method", "strategy", "shards"]):
        ax.errorbar(g.removed_shards, g.accuracy, yerr=g.accuracy_std.fillna(0), marker="o", capsize=3,
                    label=f"{method} {strategy} (N={n})")
    ax.set_xlabel("shards removed")
    ax.set_ylabel("test accuracy")
    ax.set_title("Forgetting by removing shards (mean ± sd over requests)")
    ax.legend(fontsize=7)
    return paths + [_savefig(fig, out_dir / "unlearning_drop.png")]


def unlearning_retrain(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Accuracy and wall time of retrain-shard vs the paragon by forgotten fraction."""
    df = con.sql(RETRAIN_SQL).df()
    if df.empty:
        return []
    paths = _save(df, out_dir, "unlearning_retrain", "Retrain-shard vs the paragons: accuracy, unlearning time and "
                  "speed-up vs the same-method retrain (paragon) and vs retraining the non-linear model "
                  "(paragon-nonlinear, TAFT App. C.3)")
    fig, (ax_acc, ax_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, ((method, strategy, n), g) in enumerate(df.groupby(["method", "strategy", "shards"])):
        label = f"{method} {strategy}" + ("" if strategy.startswith("paragon") else f" (N={n})")
        style = dict(marker="o", label=label, color=colors[k % len(colors)])  # one colour per curve in both panels
        ax_acc.plot(g.fraction, g.accuracy, **style)
        if strategy != "sisa-retrain":  # same retraining time as retrain-shard
            ax_time.plot(g.fraction, g.unlearn_time_s, **style)
    positive = df.fraction[df.fraction > 0]
    for ax, ylabel in ((ax_acc, "test accuracy"), (ax_time, "unlearning wall time (s)")):
        if (df.fraction == 0).any():  # fraction 0: single-sample requests, at 0 on a scale linear near it
            ax.set_xscale("symlog", linthresh=positive.min() if len(positive) else 1e-3)
        else:
            ax.set_xscale("log")
        plain_log_ticks(ax.xaxis, df.fraction)
        ax.set_xlabel("forgotten fraction of the training set (0: one sample)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    ax_time.set_yscale("log")
    plain_log_ticks(ax_time.yaxis)
    ax_acc.set_title("Accuracy after forgetting")
    ax_time.set_title("Time to forget")
    return paths + [_savefig(fig, out_dir / "unlearning_retrain.png")]


REPORTS: dict = {"unlearning_drop": unlearning_drop, "unlearning_retrain": unlearning_retrain}
