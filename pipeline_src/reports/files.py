"""How every report writes its files: a table as Markdown + CSV, a figure as PNG, atomically."""
from __future__ import annotations

from pathlib import Path

from pipeline_src.store.atomic import atomic_path, write_text


def save_table(df, out_dir: Path, stem: str, title: str, floatfmt: str | tuple[str, ...] = ".4f",
               blank_missing: bool = False) -> list[Path]:
    """Write `<stem>.md` (titled table) and `<stem>.csv` of a DataFrame; return both paths.

    Args:
        floatfmt: one format for every float column, or one per column.
        blank_missing: empty Markdown cells for missing values (else `nan`).
    """
    md, csv = out_dir / f"{stem}.md", out_dir / f"{stem}.csv"
    shown = df.astype(object).where(df.notna(), None) if blank_missing else df
    write_text(f"# {title}\n\n" + shown.to_markdown(index=False, floatfmt=floatfmt, missingval="") + "\n", md)
    write_text(df.to_csv(index=False), csv)
    return [md, csv]


def save_png(fig, path: Path) -> Path:
    """Write a matplotlib figure as PNG and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return path


def plain_log_ticks(axis, at=None) -> None:
    """Label a log (or symlog) axis in plain numbers ("%g"): at the study's values `at` (no minor
    labels), or else where matplotlib's log scale would. Its default labels are mathtext
    ("10^{-2}"), whose parser costs the report ~0.5 s to build.

    Args:
        axis: `ax.xaxis` or `ax.yaxis`, already log- or symlog-scaled.
        at: tick positions (e.g. the learning rates of a grid); None: the scale's own.
    """
    from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter

    class PlainLogFormatter(LogFormatter):  # the scale's choice of labels, written "0.6", not "6e-01"
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"

    if at is None:
        axis.set_major_formatter(PlainLogFormatter())
        axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))
        return
    axis.set_ticks(sorted(set(at)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def has_rows(con, view: str, where: str) -> bool:
    """Whether `view` exists (its files may not, yet) and has a row matching the SQL `where`."""
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}
    return view in views and con.sql(f"SELECT count(*) FROM {view} WHERE {where}").fetchall()[0][0] > 0
