"""Benchmark goals: every tracked ratio beside its goal and its floor (issue 16).

One table per device from the newest benchmark rows (`benchmarks.py` reads them). Each line is
one measured ratio, the goal it is held to, and its floor where arithmetic gives one:

- TAFT (Liu, Soatto et al., ICLR 2024) tangent forward / `torch.func.jvp`, TAFT-1 and TAFT-all:
  goal ≤ 0.9.
- TAFT-1 tangent forward / plain forward: floor (depth − k + 3k) / depth with k = 1 (a linearized
  Linear costs three products, W·x, W·t, ΔW·x); goal ≤ 1.05 × floor.
- TAFT-k train step / NLFT-k train step on the same cached features: goal ≤ 1.1 (the paper's
  Table 8 reports 1.39, shown as the reference).
- LAST (Tang et al. 2024) grid of G side networks / one network: goal ≤ 3 (for G = 16).
- DP (Bu et al. 2023 book-keeping; Lee & Kifer 2021) step / non-private step, NLFT full regime
  from cached features: goal ≤ 1.2 time, ≤ 1.1 memory, per clipping mode.
- Matching a ViT-B pair (rotation symmetry): seconds per pair, goal ≤ 5 s on the CPU, ≤ 1 s on a GPU.
"""
from __future__ import annotations

import json
import math

import pandas as pd

TAFT_JVP_GOAL = 0.9
TAFT_FLOOR_SLACK = 1.05
TAFT_NLFT_GOAL, TAFT_NLFT_PAPER = 1.1, 1.39
LAST_GRID_GOAL = 3.0
DP_TIME_GOAL, DP_MEM_GOAL = 1.2, 1.1
DP_CASE = "nlft-features-full"
MATCH_GOAL_S = {"cpu": 5.0, "cuda": 1.0}
COLUMNS = ["measure", "value", "unit", "goal", "floor", "reference", "meets goal", "sizes", "device"]


def _line(measure: str, value: float, goal: float, *, unit: str = "×", floor: float = math.nan,
          reference: float = math.nan, sizes: str = "", device: str = "") -> dict:
    ok = bool(value <= goal) if not (math.isnan(value) or math.isnan(goal)) else None
    return {"measure": measure, "value": value, "unit": unit, "goal": goal, "floor": floor, "reference": reference,
            "meets goal": ok, "sizes": sizes, "device": device}


def _short(sizes: str, keys: tuple[str, ...]) -> str:
    s = json.loads(sizes)
    return ", ".join(f"{k} {s[k]}" for k in keys if k in s)


def _ratio(by: pd.DataFrame, num: str, den: str, col: str = "time_ms") -> float:
    if num not in by.index or den not in by.index:
        return math.nan
    a, b = by.loc[num, col], by.loc[den, col]
    return float(a) / float(b) if pd.notna(a) and pd.notna(b) and float(b) > 0 else math.nan


def gemm_floors(sizes: dict) -> dict[str, float]:
    """Matrix-product (MAC) floors of the headline ratios for these sizes.

    Per token and block: Linear layers L = 12·D² (qkv 3D², proj D², fc1 + fc2 8D² at mlp ratio
    4), attention A = 2·N·D (Q·Kᵀ and P·V). Plain forward L + A. Tangent forward adds ΔW·x (L),
    W·t (L; none for the first linearized qkv, whose input tangent is 0) and dQ·Kᵀ, Q·dKᵀ, dP·V,
    P·dV (2A). A train step adds the backward: ∇W (L), ∇input (L; none into the first tuned
    qkv) and 2A, the same for NLFT and TAFT (`taft/primal_gradient.py`). The head is left out. `benchmarks/bench_taft.py` prints them too.
    """
    D, depth = sizes["embed_dim"], sizes["depth"]
    N = (sizes["img_size"] // sizes["patch_size"]) ** 2 + 1
    L, A, qkv = 12 * D * D, 2 * N * D, 3 * D * D
    out = {}
    for label, k in (("taft1", 1), ("taftall", depth)):
        plain = depth * (L + A)
        tangent = plain + k * (2 * L + 2 * A) - qkv
        nlft_train = k * (3 * L + 3 * A) - qkv
        taft_train = k * (5 * L + 5 * A) - 2 * qkv
        out[f"fwd_{label}"] = tangent / plain
        out[f"train_{label}"] = taft_train / nlft_train
    return out


def taft_lines(df: pd.DataFrame) -> list[dict]:
    """bench_taft rows (one sizes group) -> jvp, plain-forward and NLFT ratios."""
    out = []
    for (device, sizes), g in df.groupby(["device", "sizes"], sort=True):
        by, s = g.set_index("case"), json.loads(sizes)
        short = _short(sizes, ("depth", "embed_dim", "batch", "img_size", "clock"))
        for label, name in (("taft1", "TAFT-1"), ("taftall", "TAFT-all")):
            r = _ratio(by, f"tangent_forward_{label}", f"funcjvp_forward_{label}")
            if not math.isnan(r):
                out.append(_line(f"{name} tangent forward / torch.func.jvp", r, TAFT_JVP_GOAL, sizes=short, device=device))
        r = _ratio(by, "tangent_forward_taft1", "plain_forward")
        if not math.isnan(r) and "depth" in s:
            floor = (s["depth"] - 1 + 3) / s["depth"]
            out.append(_line("TAFT-1 tangent forward / plain forward", r, TAFT_FLOOR_SLACK * floor, floor=floor,
                             sizes=short, device=device))
        for label, name in (("taft1", "1"), ("taftall", "all")):
            r = _ratio(by, f"train_step_features_{label}", f"nlft_train_step_features_{label}")
            floor = gemm_floors(s)[f"train_{label}"] if {"embed_dim", "depth", "img_size", "patch_size"} <= set(s) else math.nan
            if not math.isnan(r):
                out.append(_line(f"TAFT-{name} / NLFT-{name} train step (cached features)", r, TAFT_NLFT_GOAL,
                                 floor=floor, reference=TAFT_NLFT_PAPER, sizes=short, device=device))
    return out


def last_lines(df: pd.DataFrame) -> list[dict]:
    """bench_last rows -> grid of G networks / one network (time and memory)."""
    out = []
    for (device, sizes), g in df.groupby(["device", "sizes"], sort=True):
        by = g.set_index("case")
        short = _short(sizes, ("grid", "rank", "heads", "every", "batch", "depth", "embed_dim", "attention", "clock"))
        for case in sorted(c for c in by.index if c.startswith("grid")):
            n = case.removeprefix("grid")
            r = _ratio(by, case, "last")
            if not math.isnan(r):
                out.append(_line(f"{n} LAST networks / one (time)", r, LAST_GRID_GOAL, sizes=short, device=device))
            m = _ratio(by, case, "last", "mem_mb")
            if not math.isnan(m):
                out.append(_line(f"{n} LAST networks / one (memory)", m, math.nan, sizes=short, device=device))
    return out


def dp_lines(ratios: pd.DataFrame) -> list[dict]:
    """`benchmarks.dp_ratios` output -> DP / non-private time and memory of the full regime."""
    out = []
    for _, r in ratios[ratios.case == DP_CASE].sort_values(["device", "mode"]).iterrows():
        for what, col, goal in (("time", "time_x", DP_TIME_GOAL), ("memory", "mem_x", DP_MEM_GOAL)):
            value = float(r[col]) if pd.notna(r[col]) else math.nan
            out.append(_line(f"DP {r['mode']} / non-private, {DP_CASE} ({what})", value, goal, sizes=DP_CASE,
                             device=r["device"]))
    return out


def matching_lines(df: pd.DataFrame) -> list[dict]:
    """bench_matching rows -> seconds per ViT-B pair."""
    out = []
    full = df[(df.case == "match_full") & (df.sizes.map(lambda s: json.loads(s).get("model")) == "vit_b")]
    for _, r in full.sort_values("device").iterrows():
        goal = MATCH_GOAL_S["cuda" if r["device"].startswith("cuda") else "cpu"]
        out.append(_line("matching a ViT-B pair", float(r["time_ms"]) / 1e3, goal, unit="s",
                         sizes=_short(r["sizes"], ("model", "workers")), device=r["device"]))
    return out


def goal_lines(rows: dict[str, pd.DataFrame], dp_ratios) -> pd.DataFrame:
    """All goal lines from the newest rows of each benchmark ({benchmark name: rows})."""
    lines = []
    if not rows["bench_taft"].empty:
        lines += taft_lines(rows["bench_taft"])
    if not rows["bench_last"].empty:
        lines += last_lines(rows["bench_last"])
    if not rows["bench_dp"].empty:
        lines += dp_lines(dp_ratios(rows["bench_dp"]))
    if not rows["bench_matching"].empty:
        lines += matching_lines(rows["bench_matching"])
    return pd.DataFrame(lines, columns=COLUMNS)
