"""Reports of the LAST grid study (see pipeline_src/reports/report.py for the report interface).

`last_grid`: one row per grid point (lr, rank, heads, g, T, init seed; mean over seeds and
shard counts kept apart) with its val and test accuracy, best val accuracy first; and
`last_grid.png`: test accuracy against the learning rate, one line per rank (and heads, g, T).
Only when the metrics hold grid rows (`model = 'last-grid'`, pipeline_src/steps/last_grid.py).
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pipeline_src.reports.files import has_rows, plain_log_ticks, save_png, save_table  # noqa: E402

POINT = ["lr", "rank", "heads", "every", "modules_per_block", "bias_correction", "init_seed"]

ROWS_SQL = """
SELECT method, shards AS N, {points},
       avg(value) FILTER (WHERE split = 'val') AS val_accuracy,
       avg(value) FILTER (WHERE split = 'test') AS test_accuracy,
       count(DISTINCT seed) AS seeds
FROM metrics
WHERE model = 'last-grid' AND metric = 'accuracy' AND json_extract_string(variant, '$.study') = 'last_grid'
GROUP BY ALL
"""


def grid_rows(con: duckdb.DuckDBPyConnection):
    """One row per method, N and grid point, best (val, then test) accuracy first."""
    types = {"lr": "DOUBLE", "bias_correction": "BOOLEAN"}
    points = ", ".join(f"CAST(json_extract(variant, '$.{k}') AS {types.get(k, 'BIGINT')}) AS {k}" for k in POINT)
    df = con.sql(ROWS_SQL.format(points=points)).df()
    return df.sort_values(["val_accuracy", "test_accuracy"], ascending=False, na_position="last").reset_index(drop=True)


def last_grid(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """The grid table (md + csv) and test accuracy vs lr, one line per architecture."""
    if not has_rows(con, "metrics", "model = 'last-grid'"):
        return []
    df = grid_rows(con)
    if df.empty:
        return []
    title = "LAST grid: side networks trained at once on the same features (best val accuracy first)"
    paths = save_table(df, out_dir, "last_grid", title, floatfmt=".4g")
    fig, ax = plt.subplots(figsize=(6.0, 4.5))
    arch = ["method", "N", "rank", "heads", "every", "modules_per_block", "bias_correction", "init_seed"]
    for key, part in df.groupby(arch):
        part = part.sort_values("lr")
        method, n, rank, heads, g, t, bc, seed = key
        ax.plot(part["lr"], part["test_accuracy"], marker="o",
                label=f"{method} N={n} rank={rank} heads={heads} g={g} T={t} bc={int(bc)} seed={seed}")
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis, df["lr"])
    ax.set_xlabel("learning rate")
    ax.set_ylabel("test accuracy")
    ax.set_title("LAST grid: test accuracy vs learning rate", fontsize=10)
    ax.legend(fontsize=7)
    return paths + [save_png(fig, out_dir / "last_grid.png")]


REPORTS: dict = {"last_grid": last_grid}
