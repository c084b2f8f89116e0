"""Reports of the benchmark rows (`benchmarks` view, written by `benchmarks/*.py`).

See pipeline_src/reports/report.py for the report interface. Every report reads only the newest row per
(benchmark, case, device, sizes), and returns [] when its benchmark has no rows:
  * LAST Table 7 (bench_last): peak training memory and step time of full fine-tuning, NLFT-1,
    LAST and the grid of LAST networks, with ratios to full fine-tuning; one table per device;
  * fast-clipping figure (bench_dp): DP step time and peak memory as multiples of the
    non-private step, per clipping mode and case (table + PNG, pure-FC cases included);
  * TAFT (bench_taft): tangent forward vs plain forward vs torch.func.jvp;
  * matching (bench_matching): time per model pair vs parameter count (table + PNG);
  * unlearning (unlearning): speedup of retrain-shard over the paragon per shard count N;
  * goals (`benchmark_goals.py`): every tracked ratio beside its goal and its floor.
"""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pipeline_src.reports.benchmark_goals import goal_lines  # noqa: E402
from pipeline_src.reports.files import save_png as _save_png  # noqa: E402
from pipeline_src.store.atomic import write_text  # noqa: E402

LATEST_SQL = """
SELECT "case", device, sizes, time_ms_median AS time_ms, peak_mem_mb AS mem_mb, repeats
FROM (SELECT *, row_number() OVER (PARTITION BY benchmark, "case", device, sizes ORDER BY created_at DESC) AS newest
      FROM benchmarks WHERE benchmark = $name)
WHERE newest = 1
ORDER BY device, "case", sizes
"""
LAST_ORDER = ["full", "nlft1", "last", "last_cached"]  # then grid<k>
DP_MODES = ["hooks", "ghost", "fast", "bk"]


def _rows(con: duckdb.DuckDBPyConnection, name: str) -> pd.DataFrame:
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}
    if "benchmarks" not in views:
        return pd.DataFrame()
    return con.execute(LATEST_SQL, {"name": name}).df()


def _key(sizes: str, drop: tuple[str, ...] = ()) -> str:
    """The sizes JSON without the keys in `drop`: what rows to be compared must share."""
    return json.dumps({k: v for k, v in json.loads(sizes).items() if k not in drop}, sort_keys=True)


def _size(sizes: str, key: str):
    return json.loads(sizes).get(key)


def _save(sections: list[tuple[str, pd.DataFrame]], out_dir: Path, stem: str, title: str) -> list[Path]:
    """One Markdown file with a table per section (device) and one CSV of all rows (with `device`)."""
    md, csv = out_dir / f"{stem}.md", out_dir / f"{stem}.csv"
    text = f"# {title}\n"
    for heading, df in sections:
        text += f"\n## {heading}\n\n" + df.drop(columns="device").to_markdown(index=False, floatfmt=".3f") + "\n"
    write_text(text, md)
    write_text(pd.concat([df for _, df in sections]).to_csv(index=False), csv)
    return [md, csv]


def last_table7(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """LAST Table 7: memory and step time of full fine-tuning, NLFT-1, LAST and the LAST grid."""
    df = _rows(con, "bench_last")
    if df.empty:
        return []
    sections = []
    for (device, sizes), g in df.groupby(["device", "sizes"], sort=True):
        full = g[g.case == "full"]
        ref_t, ref_m = (full.time_ms.iloc[0], full.mem_mb.iloc[0]) if len(full) else (float("nan"),) * 2
        g = g.assign(order=g.case.map(lambda c: LAST_ORDER.index(c) if c in LAST_ORDER else len(LAST_ORDER)))
        g = g.sort_values(["order", "case"])
        table = pd.DataFrame({"case": g.case, "peak_mem_mb": g.mem_mb, "mem / full": g.mem_mb / ref_m,
                              "step_ms": g.time_ms, "time / full": g.time_ms / ref_t, "repeats": g.repeats})
        sections.append((f"{device} — {_sizes_text(sizes)}", table.assign(device=device)))
    return _save(sections, out_dir, "bench_last_table7",
                 "LAST Table 7 layout: peak training memory and step time, relative to full fine-tuning")


def _sizes_text(sizes: str) -> str:
    s = json.loads(sizes)
    keys = ("batch", "img_size", "depth", "embed_dim", "grid", "rank")
    return ", ".join(f"{k} {s[k]}" for k in keys if k in s)


def dp_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, case, mode): time and memory of the DP step over the non-private step."""
    df = df.assign(base=df.case.str.rsplit(":", n=1).str[0], mode=df.case.str.rsplit(":", n=1).str[1],
                   key=df.sizes.map(lambda s: _key(s, ("mode", "clock"))))
    ref = df[df["mode"] == "nonprivate"].set_index(["device", "base", "key"])[["time_ms", "mem_mb"]].add_suffix("_np")
    dp = df[df["mode"] != "nonprivate"].join(ref, on=["device", "base", "key"])
    dp = dp.dropna(subset=["time_ms_np"])
    return pd.DataFrame({"device": dp.device, "case": dp.base, "mode": dp["mode"],
                         "nonprivate_ms": dp.time_ms_np, "nonprivate_mb": dp.mem_mb_np,
                         "time_x": dp.time_ms / dp.time_ms_np, "mem_x": dp.mem_mb / dp.mem_mb_np})


def _dp_case_order(case: str):
    """Pure-FC cases (fc-B<batch>-p<out>) by output dimension, then batch; then the others."""
    if case.startswith("fc-B"):
        batch, out = case[4:].split("-p")
        return (0, int(out), int(batch), "")
    return (1, 0, 0, case)


def dp_figure(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Fast-clipping runtime/memory figure: DP step cost as multiples of the non-private step."""
    df = _rows(con, "bench_dp")
    if df.empty:
        return []
    r = dp_ratios(df)
    if r.empty:
        return []
    modes = [m for m in DP_MODES if m in set(r["mode"])] + sorted(set(r["mode"]) - set(DP_MODES))
    sections, paths = [], []
    for i, (device, g) in enumerate(r.groupby("device", sort=True)):
        cases = sorted(g.case.unique(), key=_dp_case_order)
        wide = g.pivot_table(index=["case", "nonprivate_ms", "nonprivate_mb"], columns="mode", values=["time_x", "mem_x"])
        wide.columns = [f"{m} {'time' if v == 'time_x' else 'mem'}×" for v, m in wide.columns]
        cols = [f"{m} {v}×" for m in modes for v in ("time", "mem") if f"{m} {v}×" in wide.columns]
        wide = wide[cols].reset_index()
        wide = wide.set_index("case").loc[cases].reset_index()
        sections.append((device, wide.assign(device=device)))
        fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.7 * len(cases) * len(modes) / 2), 8), sharex=True)
        width = 0.8 / len(modes)
        for ax, col, label in ((axes[0], "time_x", "step time / non-private"), (axes[1], "mem_x", "peak memory / non-private")):
            for j, mode in enumerate(modes):
                vals = g[g["mode"] == mode].set_index("case")[col].reindex(cases)
                ax.bar([k + (j - (len(modes) - 1) / 2) * width for k in range(len(cases))], vals, width=width, label=mode)
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
            ax.set_yscale("log")
            ax.set_ylabel(label + " (log)")
        axes[0].legend(fontsize=8, ncol=len(modes))
        axes[0].set_title(f"DP step cost per clipping mode — {device}\n(fc-B<batch>-p<output dim>: pure FC layer, input 768)", fontsize=10)
        axes[1].set_xticks(range(len(cases)), cases, rotation=60, ha="right", fontsize=7)
        paths.append(_save_png(fig, out_dir / f"bench_dp_figure{'' if i == 0 else f'_{i}'}.png"))
    return _save(sections, out_dir, "bench_dp_ratios",
                 "DP step time and peak memory as multiples of the non-private step (× columns)") + paths


def taft_ratios(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """TAFT benchmark: tangent forward over the plain forward and over torch.func.jvp."""
    df = _rows(con, "bench_taft")
    if df.empty:
        return []
    out = []
    for (device, _), g in df.groupby(["device", "sizes"], sort=True):
        by = g.set_index("case")
        if "plain_forward" not in by.index:
            continue
        plain = by.loc["plain_forward"]
        for case in sorted(c for c in by.index if c.startswith("tangent_forward_")):
            label = case.removeprefix("tangent_forward_")
            tan, jvp = by.loc[case], by.loc[f"funcjvp_forward_{label}"] if f"funcjvp_forward_{label}" in by.index else None
            out.append({"device": device, "variant": label, "plain_ms": plain.time_ms, "tangent_ms": tan.time_ms,
                        "jvp_ms": jvp.time_ms if jvp is not None else float("nan"),
                        "tangent / plain time": tan.time_ms / plain.time_ms,
                        "tangent / jvp time": tan.time_ms / jvp.time_ms if jvp is not None else float("nan"),
                        "tangent / plain mem": tan.mem_mb / plain.mem_mb,
                        "tangent / jvp mem": tan.mem_mb / jvp.mem_mb if jvp is not None else float("nan")})
    if not out:
        return []
    t = pd.DataFrame(out)
    return _save([(d, g) for d, g in t.groupby("device", sort=True)], out_dir, "bench_taft_ratios",
                 "TAFT: tangent forward vs plain forward vs torch.func.jvp (ratios of median time and peak memory)")


def matching_scaling(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Matching time per model pair vs parameter count (match_full, and its parts)."""
    df = _rows(con, "bench_matching")
    if df.empty:
        return []
    df = df.assign(model=df.sizes.map(lambda s: _size(s, "model")), params=df.sizes.map(lambda s: _size(s, "params")),
                   workers=df.sizes.map(lambda s: str(_size(s, "workers") or "-")))
    wide = df.pivot_table(index=["device", "model", "params", "workers"], columns="case", values="time_ms").reset_index()
    wide.columns = [str(c) if c in ("device", "model", "params", "workers") else f"{c} ms" for c in wide.columns]
    first = [c for c in ("match_full ms", "match_attention ms", "match_ffn ms") if c in wide.columns]
    wide = wide[["device", "model", "params", "workers"] + first + sorted(set(wide.columns[4:]) - set(first))]
    wide = wide.sort_values(["device", "params"])
    paths = _save([(d, g) for d, g in wide.groupby("device", sort=True)], out_dir, "bench_matching_scaling",
                  "Matching: median time per model pair vs parameter count")
    full = df[df.case == "match_full"]
    if full.empty:
        return paths
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (device, workers), g in full.groupby(["device", "workers"], sort=True):
        g = g.sort_values("params")
        ax.plot(g.params, g.time_ms / 1e3, marker="o", label=device if workers == "-" else f"{device} ({workers} workers)")
        for p, t, m in zip(g.params, g.time_ms / 1e3, g.model):
            ax.annotate(m, (p, t), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters per model")
    ax.set_ylabel("time per model pair (s, median)")
    ax.set_title("Matching (attention + FFN of all blocks) vs model size", fontsize=10)
    ax.legend(fontsize=7)
    return paths + [_save_png(fig, out_dir / "bench_matching_scaling.png")]


UNLEARNING_PER_N = ("shards", "samples", "paragon_ms_median", "speedup_vs_paragon", "goal_speedup")


def unlearning_speedup(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Speedup of retraining one shard over retraining the paragon, per shard count N."""
    df = _rows(con, "unlearning")
    if df.empty:
        return []
    df = df.assign(key=df.sizes.map(lambda s: _key(s, UNLEARNING_PER_N)))
    paragon = df[df.case == "paragon"].set_index(["device", "key"])["time_ms"].rename("paragon_ms")
    shard = df[df.case == "retrain-shard"].join(paragon, on=["device", "key"]).dropna(subset=["paragon_ms"])
    if shard.empty:
        return []
    n = shard.sizes.map(lambda s: _size(s, "shards"))
    t = pd.DataFrame({"device": shard.device, "method": shard.sizes.map(lambda s: _size(s, "method")), "N": n,
                      "paragon_ms": shard.paragon_ms, "retrain_shard_ms": shard.time_ms,
                      "speedup": shard.paragon_ms / shard.time_ms, "goal (0.5·N)": 0.5 * n})
    t["meets goal"] = t["speedup"] >= t["goal (0.5·N)"]
    t = t.sort_values(["device", "method", "N"])
    return _save([(d, g) for d, g in t.groupby("device", sort=True)], out_dir, "bench_unlearning_speedup",
                 "Unlearning: wall-time speedup of retrain-shard over the paragon (forget one sample)")



def bench_goals(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """bench_goals.{md,csv}: each ratio beside its goal and its floor, one table per device."""
    rows = {name: _rows(con, name) for name in ("bench_taft", "bench_last", "bench_dp", "bench_matching")}
    t = goal_lines(rows, dp_ratios)
    if t.empty:
        return []
    return _save([(d, g) for d, g in t.groupby("device", sort=True)], out_dir, "bench_goals",
                 "Benchmark ratios beside their goals and floors (newest rows; floor: the arithmetic bound where "
                 "one exists; reference: the paper's figure)")


REPORTS: dict = {
    "bench_last_table7": last_table7,
    "bench_dp_figure": dp_figure,
    "bench_taft_ratios": taft_ratios,
    "bench_matching_scaling": matching_scaling,
    "bench_unlearning_speedup": unlearning_speedup,
    "bench_goals": bench_goals,
}
