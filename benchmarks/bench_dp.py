"""DP step time and peak memory: non-private vs Opacus hooks vs Opacus ghost vs our fast
norm samplers in Opacus' two-pass ghost clipping ("fast") vs our single-backward
book-keeping clipping ("bk"; Bu et al. 2023, "Differentially Private Optimization on Large
Model at Small Cost"), for NLFT regimes on a small ViT and for the fully-connected case
across output dimension and batch size (Lee & Kifer 2021, "Scaling up differentially
private deep learning with fast per-example gradient clipping", Figure 4).

The first-step probe (`pipeline_src/dp/first_step_probe.py`: one extra backward of one example's
loss and a per-layer rebuild, on a job's first step) is timed with `--probe`: a probed step against a
plain one of the same mode, interleaved, and its cost as a share of a job of 80 steps (the default
study's DP jobs: 10 epochs of ceil(500/64) steps) or 20 (with privacy.shards [4], n̄ = 125).

Run: python benchmarks/bench_dp.py [--quick] [--device cuda] [--vit-b] [--modes bk,fast] [--clock cpu] [--probe]
Writes results/benchmarks/bench_dp.parquet and prints ratio tables (DP / non-private).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipeline_src.dp import apply_regime, nlft_scope  # noqa: E402
from pipeline_src.dp.private_training import dp_backward, make_private_model  # noqa: E402
from pipeline_src.store.benchmark_rows import (  # noqa: E402
    benchmark_row,
    peak_memory_mb,
    pin_mmap_threshold,
    time_median,
    write_benchmark_rows,
)

MODES = ("nonprivate", "hooks", "ghost", "fast", "bk")


class Tail(nn.Module):
    """The last k blocks, final norm and head of a timm ViT, fed cached prefix tokens (B, N, D)."""

    def __init__(self, vit: nn.Module, k: int) -> None:
        super().__init__()
        self.vit, self.k = vit, k

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for blk in self.vit.blocks[-self.k:]:
            h = blk(h)
        return self.vit.forward_head(self.vit.norm(h))


def make_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mode: str, probe: bool = False):
    """A closure doing one optimizer step of `mode` on the fixed batch (x, y); the first-step probe
    runs on the first call only, or (`probe`) on every call."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3)
    if mode == "nonprivate":
        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return step
    loader = DataLoader(TensorDataset(x.cpu(), y.cpu()), batch_size=len(x))
    _, module, dp_opt, _ = make_private_model(model, opt, loader, mode=mode, sigma=1.0, max_grad_norm=1.0)
    first_step_probe = module.probe if mode == "bk" else module.first_step_probe

    def dp_step():
        first_step_probe.armed = first_step_probe.armed or probe
        dp_opt.zero_grad()
        dp_backward(module, dp_opt, F.cross_entropy(module(x), y, reduction="none"), mode)
        dp_opt.step()
    return dp_step


def cpu_time_ms(fn) -> list[float]:
    """CPU time of this process for one `fn()` call, in ms: with one torch thread it is the
    step's own compute, unaffected by other processes queueing for the same cores."""
    t0 = time.process_time()
    fn()
    return [(time.process_time() - t0) * 1e3]


def measure(base: nn.Module, prepare, x, y, device: str, repeats: int, sizes: dict, case: str,
            args_modes: tuple[str, ...] = MODES, clock: str = "wall") -> list[dict]:
    """Time the modes interleaved (one step of each per round), so load from other
    processes on a shared machine hits every mode alike; medians over rounds.
    clock "cpu" times process CPU time instead of wall time (CPU, one thread)."""
    steps = {}
    for mode in args_modes:
        model = copy.deepcopy(base)
        prepare(model)
        steps[mode] = make_step(model, x, y, mode)
    times: dict[str, list[float]] = {m: [] for m in args_modes}
    for _ in range(repeats):
        for mode in args_modes:
            if clock == "cpu":
                if not times[mode]:
                    steps[mode]()  # warm-up
                times[mode] += cpu_time_ms(steps[mode])
            else:
                times[mode] += time_median(steps[mode], repeats=1, warmup=1 if not times[mode] else 0,
                                           device=device)[1]
    rows = []
    for mode in args_modes:
        peak = peak_memory_mb(steps[mode], device=device)
        row_sizes = {**sizes, "mode": mode, "clock": clock}
        try:
            rows.append(benchmark_row("bench_dp", f"{case}:{mode}", device, row_sizes, times[mode], peak))
        except ValueError:  # a step too small to move the peak: no figure, and the row says why
            rows.append(benchmark_row("bench_dp", f"{case}:{mode}", device, row_sizes, times[mode], None,
                                      not_measured=f"peak growth {peak:.2f} MB is below what the allocator shows"))
        print(f"  {case:<28} {mode:<10} {statistics.median(times[mode]):9.2f} ms  {peak:9.1f} MB", flush=True)
    return rows


def nlft_rows(args, device: str) -> list[dict]:
    from timm.models.vision_transformer import VisionTransformer

    if args.vit_b:
        cfg = dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12)
    else:  # ViT-Ti width, depth 6, 64 patch tokens
        cfg = dict(img_size=32, patch_size=4, embed_dim=192, depth=6, num_heads=3)
    torch.manual_seed(0)
    vit = VisionTransformer(num_classes=10, **cfg).to(device)
    vit.requires_grad_(False)
    b = args.batch
    imgs = torch.randn(b, 3, cfg["img_size"], cfg["img_size"], device=device)
    y = torch.randint(0, 10, (b,), device=device)
    with torch.no_grad():  # cached frozen-prefix features, as the `features` rule stores them
        h = vit.norm_pre(vit._pos_embed(vit.patch_embed(imgs)))
        for blk in vit.blocks[:-1]:
            h = blk(h)
    rows = []
    for inp in args.inputs:
        for regime in args.regimes:
            sizes = dict(benchmark="nlft", input=inp, regime=regime, batch=b, tokens=h.shape[1], **cfg)
            base = Tail(vit, 1) if inp == "features" else vit
            rows += measure(base, lambda m: apply_regime(m, regime, nlft_scope(m.vit if isinstance(m, Tail) else m)),
                            h if inp == "features" else imgs, y, device, args.repeats, sizes,
                            f"nlft-{inp}-{regime}", args.modes, args.clock)
    return rows


def fc_rows(args, device: str) -> list[dict]:
    rows = []
    for b in args.fc_batches:
        for p in args.fc_dims:
            torch.manual_seed(0)
            base = nn.Sequential(nn.Linear(args.fc_in, p), nn.ReLU(), nn.Linear(p, 10)).to(device)
            x = torch.randn(b, args.fc_in, device=device)
            y = torch.randint(0, 10, (b,), device=device)
            sizes = dict(benchmark="fc", batch=b, d_in=args.fc_in, d_hidden=p)
            rows += measure(base, lambda m: None, x, y, device, args.repeats, sizes, f"fc-B{b}-p{p}", args.modes, args.clock)
    return rows


JOB_STEPS = (20, 80)  # DP jobs of 4 shards and of the default study's 1 (module docstring)


def probe_rows(args, device: str) -> list[dict]:
    """Probed vs plain steps of each DP mode on the NLFT tail (full and fc regimes, cached features)
    and the fully-connected case; case `probe-<case>:<mode>:{probed,plain}`."""
    from timm.models.vision_transformer import VisionTransformer

    cfg = dict(img_size=32, patch_size=4, embed_dim=192, depth=6, num_heads=3)
    torch.manual_seed(0)
    vit = VisionTransformer(num_classes=10, **cfg).to(device).requires_grad_(False)
    b = args.batch
    h = torch.randn(b, (cfg["img_size"] // cfg["patch_size"]) ** 2 + 1, cfg["embed_dim"], device=device)
    y = torch.randint(0, 10, (b,), device=device)
    mlp = nn.Sequential(nn.Linear(args.fc_in, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    cases = [(f"nlft-features-{r}", Tail(vit, 1), lambda m, r=r: apply_regime(m, r, nlft_scope(m.vit)), h)
             for r in ("full", "fc")]
    cases.append((f"fc-B{b}-p512", mlp, lambda m: None, torch.randn(b, args.fc_in, device=device)))
    rows = []
    for case, base, prepare, x in cases:
        for mode in args.modes[1:]:
            steps = {}
            for kind in ("probed", "plain"):
                model = copy.deepcopy(base)
                prepare(model)
                steps[kind] = make_step(model, x, y, mode, probe=kind == "probed")
            times = {k: [] for k in steps}
            for _ in range(args.repeats):
                for kind, fn in steps.items():
                    if args.clock == "cpu":
                        if not times[kind]:
                            fn()
                        times[kind] += cpu_time_ms(fn)
                    else:
                        times[kind] += time_median(fn, repeats=1, warmup=0 if times[kind] else 1, device=device)[1]
            for kind in steps:
                sizes = dict(benchmark="probe", case=case, batch=b, mode=mode, probe=kind, clock=args.clock)
                rows.append(benchmark_row("bench_dp", f"probe-{case}:{mode}:{kind}", device, sizes, times[kind],
                                          None, not_measured="time only"))
            t_probe, t_plain = statistics.median(times["probed"]), statistics.median(times["plain"])
            extra = (t_probe - t_plain) / t_plain
            print(f"  probe {case:<22} {mode:<6} plain {t_plain:8.2f} ms  probed {t_probe:8.2f} ms  "
                  f"extra {extra:5.2f} step = " + ", ".join(f"{100 * extra / n:4.1f} % of a {n}-step job"
                                                           for n in JOB_STEPS), flush=True)
    return rows


def ratio_table(rows: list[dict]) -> str:
    by_case: dict[str, dict[str, dict]] = {}
    for r in rows:
        case, mode = r["case"].rsplit(":", 1)
        by_case.setdefault(case, {})[mode] = r
    modes = [k for k in MODES[1:] if any(r["case"].endswith(f":{k}") for r in rows)]
    lines = [f"{'case':<28} {'non-private':>16} " + " ".join(f"{k + ' t/mem':>16}" for k in modes)]
    for case, m in by_case.items():
        t0, m0 = m["nonprivate"]["time_ms_median"], m["nonprivate"]["peak_mem_mb"] or 0.0  # None: not measured

        def mem(k: str) -> str:  # peak growth below 1 MB is allocator noise on the CPU: no memory ratio then
            return f"{m[k]['peak_mem_mb'] / m0:6.2f}x" if m0 >= 1.0 and m[k]["peak_mem_mb"] else "    n/a"
        cells = [f"{m[k]['time_ms_median'] / t0:6.2f}x/" + mem(k) for k in modes]
        lines.append(f"{case:<28} {t0:8.1f}ms/{m0:5.0f}MB " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and sizes")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vit-b", action="store_true", help="ViT-B/16 at 224 px (random weights) for GPU runs")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    ap.add_argument("--out-dir", default="results/benchmarks")
    ap.add_argument("--modes", default=",".join(MODES[1:]),
                    help=f"comma-separated DP modes to compare with non-private (default all: {','.join(MODES[1:])})")
    ap.add_argument("--regimes", default=None, help="comma-separated NLFT regimes (default: all; --quick: full,fc)")
    ap.add_argument("--probe", action="store_true", help="only the first-step probe's cost (probed vs plain steps)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time, or process CPU time (CPU device with --threads 1 only; steady under load)")
    args = ap.parse_args()
    if args.clock == "cpu" and (args.device != "cpu" or args.threads != 1):
        ap.error("--clock cpu needs --device cpu and --threads 1")
    unknown = set(args.modes.split(",")) - set(MODES[1:])
    if unknown:
        ap.error(f"unknown --modes {sorted(unknown)}; choose from {MODES[1:]}")
    args.modes = ("nonprivate", *[k for k in MODES[1:] if k in args.modes.split(",")])
    args.repeats = 5 if args.quick else 11
    args.regimes = (args.regimes.split(",") if args.regimes else
                    ["full", "fc"] if args.quick else ["full", "bitfit", "layernorm", "fc"])
    args.inputs = ["features"] if args.quick else ["features", "images"]
    args.fc_in = 128
    args.fc_dims = [64, 512] if args.quick else [64, 256, 1024]
    args.fc_batches = [32] if args.quick else [32, 128, 512]
    if args.vit_b:
        args.fc_in, args.fc_dims = 768, [768, 3072, 12288]
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
        pin_mmap_threshold()  # RSS follows tensor frees, so peak RSS growth is a fair memory measure
    print(f"device={args.device} threads={torch.get_num_threads()} clock={args.clock}")
    if args.probe:
        path = write_benchmark_rows("bench_dp_probe", probe_rows(args, args.device), args.out_dir)
        print(f"\nwrote probe rows to {path}")
        return
    rows = nlft_rows(args, args.device) + fc_rows(args, args.device)
    path = write_benchmark_rows("bench_dp", rows, args.out_dir)
    print("\nDP / non-private (time x / peak memory x); goal: <= 1.3x time, <= 1.2x memory")
    print(ratio_table(rows))
    print(f"\nwrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
