"""The per-rule efficiency table: where a study's time goes and how far each rule is from the hardware.

`efficiency.{md,csv}`, one row per rule, from two kinds of small files under `results/logs/`:
- the jobs' benchmark files (`<job>.bench.tsv`, the `jobs` view, `store/job_bench.py`): each job's wall time `s`;
- the jobs' own counters (`<job>.counters.parquet`, the `job_counters` view, written by
  `store/job_counters.py`): images (or feature rows) through the model, every epoch counted, and
  the model FLOPs counted with PyTorch's FLOP formulas on the job's first batch;
- the jobs' exact peak RSS (`<job>.rss.json`, the `job_rss` view, `store/job_rss.py`): `ru_maxrss`
  from `os.wait4` of the process that reaped the job, its shutdown included.

Columns: jobs, total wall time and its share of the study, the share of that wall time inside the
step itself (the rest is start-up: the launcher, the fork, imports, loading), the seconds outside the
step summed over the rule's jobs (`outside_step_s`: the fixed cost that fewer, larger jobs save;
jobs without counters are left out of both), the largest peak RSS of
the rule's jobs, images, images/s,
GFLOP per image, achieved GFLOP/s over the jobs' wall time, and that as a percentage of the
machine's GEMM peak measured here at the jobs' thread count, in the math mode the jobs computed in
(`store/gemm_peak.py`; the `math` column: bfloat16, float16, tf32, float32; jobs counted before
the mode was recorded count as float32; the table's title names the device, the mode and the
probe), and the same over the steps' own wall time (start-up excluded:
what is left is the model loop's own distance from the hardware). Rules whose jobs count no images (prepare, compose, ...) show
only their time. A rule's jobs without a counters file (written before counting existed, or a
step that counts nothing) take their rule from the log folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import duckdb
import pandas as pd

from pipeline_src.reports.files import has_rows, save_table

JOBS_SQL = """
SELECT j.filename AS path, j.s AS wall_s, c.rule, c.images, c.flops, c.flop_images, c.device, c.math, c.device_name,
       c.threads, c.step_wall_s, r.peak_rss_mb
FROM (SELECT filename, sum(s) AS s FROM jobs GROUP BY filename) j
LEFT JOIN {counters} c
  ON regexp_replace(j.filename, '\\.bench\\.tsv$', '') = regexp_replace(c.filename, '\\.counters\\.parquet$', '')
LEFT JOIN {rss} r
  ON regexp_replace(j.filename, '\\.bench\\.tsv$', '') = regexp_replace(r.filename, '\\.rss\\.json$', '')
"""
NO_COUNTERS = ("(SELECT NULL::VARCHAR AS filename, NULL::VARCHAR AS rule, NULL::BIGINT AS images, "
               "NULL::DOUBLE AS flops, NULL::BIGINT AS flop_images, NULL::VARCHAR AS device, NULL::VARCHAR AS math, "
               "NULL::VARCHAR AS device_name, NULL::INTEGER AS threads, NULL::DOUBLE AS step_wall_s WHERE false)")
NO_RSS = "(SELECT NULL::VARCHAR AS filename, NULL::DOUBLE AS peak_rss_mb WHERE false)"

# Log folders whose jobs come from more than one rule: the job file's stem tells them apart.
# `shardN` and `ensemble` are the per-shard and ensemble jobs of runs before `evaluate_shards`.
_BY_STEM = {"evaluate": {"soup": "evaluate_soup", "shards": "evaluate_shards", "ensemble": "evaluate_ensemble"}}


def rule_of_log(path: str) -> str:
    """The rule of a job from its benchmark path `.../logs/<folder>/.../<stem>.bench.tsv`."""
    parts = Path(path).parts
    folder = parts[parts.index("logs") + 1] if "logs" in parts else Path(path).parent.name
    stem = Path(path).name.removesuffix(".bench.tsv")
    if folder == "evaluate":
        return _BY_STEM["evaluate"].get(stem, "evaluate_shard")
    if folder == "train" and stem == "vectorized":
        return "train_vectorized"
    return folder.removesuffix(".bench.tsv")


def job_table(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per job: its benchmark wall time joined with its counters and its peak RSS (NULL where none)."""
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}
    counters = NO_COUNTERS
    if "job_counters" in views:  # counters written before the math mode was recorded have no column
        columns = {r[0] for r in con.sql("DESCRIBE job_counters").fetchall()}
        counters = "job_counters" if "math" in columns else "(SELECT *, NULL::VARCHAR AS math FROM job_counters)"
    df = con.sql(JOBS_SQL.format(counters=counters,
                                 rss="job_rss" if "job_rss" in views else NO_RSS)).df()
    df["rule"] = [r if isinstance(r, str) and r else rule_of_log(p) for r, p in zip(df.rule, df.path)]
    return df


def rule_table(jobs: pd.DataFrame, peak: Callable[[str, int, str], tuple[float, str] | None]) -> pd.DataFrame:
    """Per-rule sums and rates of a `job_table`, longest total wall time first.

    Args:
        jobs: one row per job (`job_table`).
        peak: (device, threads, math mode) → (GEMM peak FLOP/s in that mode, the probe's words) on
            this machine, or None where the device is not here to measure.
    """
    rows = []
    total_wall = jobs.wall_s.sum()
    for rule, g in jobs.groupby("rule", sort=False):
        counted = g[g.images.fillna(0) > 0]
        flopped = g[g.flops.notna() & (g.flop_images.fillna(0) > 0)]
        row = {"rule": rule, "jobs": len(g), "wall_s": g.wall_s.sum(),
               "wall_share_pct": 100 * g.wall_s.sum() / total_wall if total_wall > 0 else None,
               "in_step_pct": (100 * g.step_wall_s.sum() / g.wall_s[g.step_wall_s.notna()].sum()
                               if g.step_wall_s.notna().any() and g.wall_s[g.step_wall_s.notna()].sum() > 0 else None),
               # the fixed cost: each job's wall time outside its step (start, imports, load, write), summed
               "outside_step_s": ((g.wall_s - g.step_wall_s).clip(lower=0)[g.step_wall_s.notna()].sum()
                                  if g.step_wall_s.notna().any() else None),
               "peak_rss_mb": g.peak_rss_mb.max() if g.peak_rss_mb.notna().any() else None,
               "images": int(counted.images.sum()) if len(counted) else None,
               "images_per_s": counted.images.sum() / counted.wall_s.sum() if len(counted) and counted.wall_s.sum() > 0
               else None,
               "gflop_per_image": None, "gflop_per_s": None, "peak_gflop_per_s": None, "math": None,
               "peak_pct": None, "in_step_peak_pct": None, "device": None, "threads": None}
        if len(flopped):
            flops, wall = flopped.flops.sum(), flopped.wall_s.sum()
            device = flopped.device.mode().iloc[0]
            threads = int(flopped.threads.mode().iloc[0])
            math = flopped.math.fillna("float32").mode().iloc[0]  # unrecorded: the float32 of the old probe
            row.update(gflop_per_image=flops / flopped.flop_images.sum() / 1e9, device=device, math=math,
                       threads=threads, gflop_per_s=flops / wall / 1e9 if wall > 0 else None)
            measured = peak(device, threads, math)
            if measured is not None and row["gflop_per_s"] is not None:
                row["peak_gflop_per_s"] = measured[0] / 1e9
                row["peak_pct"] = 100 * row["gflop_per_s"] / row["peak_gflop_per_s"]
                step_wall = flopped.step_wall_s.sum()
                if flopped.step_wall_s.notna().all() and step_wall > 0:  # the same FLOPs over the step's own time
                    row["in_step_peak_pct"] = 100 * flops / step_wall / measured[0]
        rows.append(row)
    return pd.DataFrame(rows).sort_values("wall_s", ascending=False, ignore_index=True)


def machine_peaks(budget_s: float = 1.5) -> Callable[[str, int, str], tuple[float, str] | None]:
    """GEMM peaks of this machine, measured once per (device, threads, math mode) on first use,
    within `budget_s` seconds in all (a probe gets 0.4 s, or what is left)."""
    import os

    import torch

    from pipeline_src.store.gemm_peak import measure_gemm_peak

    cache: dict[tuple[str, int, str], tuple[float, str] | None] = {}
    spent = [0.0]

    def peak(device: str, threads: int, math: str = "float32") -> tuple[float, str] | None:
        key = (device, threads, math)
        if key not in cache:
            here = device == "cpu" or (device == "cuda" and torch.cuda.is_available())
            left = budget_s - spent[0]
            if not here or left < 0.05:
                cache[key] = None
            else:
                t = min(threads, os.cpu_count() or threads) if device == "cpu" else None
                p = measure_gemm_peak(device, threads=t, budget_s=min(0.4, left), math=math)
                spent[0] += p.seconds
                cache[key] = (p.flops_per_s, f"{p.device_name} ({p.threads} thread{'s' * (p.threads > 1)}, "
                                             f"{p.size}² {p.math} matmul)")
        return cache[key]

    peak.cache = cache  # type: ignore[attr-defined]  (read for the table's title)
    return peak


def efficiency_report(con: duckdb.DuckDBPyConnection, out_dir: Path,
                      peak: Callable[[str, int], tuple[float, str] | None] | None = None) -> list[Path]:
    """`efficiency.{md,csv}`: the per-rule table; nothing when no job has a benchmark file."""
    if not has_rows(con, "jobs", "true"):
        return []
    peak = peak or machine_peaks()
    table = rule_table(job_table(con), peak)
    probes = sorted({k: p for k, p in getattr(peak, "cache", {}).items() if p}.items())
    where = "; ".join(f"{p[1]}: {p[0] / 1e9:.1f} GFLOP/s" for _, p in probes)
    title = ("Per-rule efficiency: wall time (Snakemake benchmark files), peak RSS (wait4 of each job process), "
             "images and model FLOPs (the jobs' "
             "counters, torch's FLOP formulas) against the measured GEMM peak"
             + (f" ({where})" if where else ""))
    formats = {"wall_s": ".1f", "wall_share_pct": ".1f", "in_step_pct": ".0f", "outside_step_s": ".1f", "peak_rss_mb": ".0f", "images": ".0f", "images_per_s": ".1f",
               "gflop_per_image": ".4g", "gflop_per_s": ".3g", "peak_gflop_per_s": ".1f", "peak_pct": ".2f",
               "in_step_peak_pct": ".2f",
               "threads": ".0f", "math": "s"}
    return save_table(table, out_dir, "efficiency", title, floatfmt=tuple(formats.get(c, "g") for c in table.columns),
                      blank_missing=True)


REPORTS = {"efficiency": efficiency_report}
