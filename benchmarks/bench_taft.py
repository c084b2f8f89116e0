"""Benchmark of the closed-form tangent ViT (TAFT; Liu, Soatto et al., ICLR 2024).

Measures, with runs of all cases interleaved and medians quoted:
  (a) tangent forward (primal + JVP) of TAFT-1 and TAFT-all,
  (b) the plain forward of the same network (timm default, fused SDPA; and unfused),
  (c) the peer: torch.func.jvp + functional_call w.r.t. the same parameters,
  (d) training steps/s from cached prefix features vs from images,
  (e) the TAFT-k train step vs the NLFT-k train step on the same cached features and batch,
      each as the pipeline trains it: AdamW; TAFT with the rescaled square loss and its L2 on
      Δw (`taft/train.py`), NLFT with cross-entropy through timm's own blocks (fused SDPA;
      `methods/nonlinear.py`). The TAFT paper's Table 8 has 0.204 / 0.147 s = 1.39×.
Peak memory per case (`peak_memory_mb`): growth above what is resident before the call
(model, data, optimizer state): CUDA max allocated, or CPU peak RSS growth.
Writes rows to results/benchmarks/bench_taft.parquet and prints a ratio table.

    python benchmarks/bench_taft.py [--quick]           # small ViT on CPU
    python benchmarks/bench_taft.py --threads 1 --clock process   # on a shared CPU
    python benchmarks/bench_taft.py --vit-b --device cuda
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_src.methods.nonlinear import TailFineTune  # noqa: E402
from pipeline_src.reports.benchmark_goals import gemm_floors  # noqa: E402
from pipeline_src.store.benchmark_rows import (  # noqa: E402
    benchmark_row,
    emit_peaks,
    peak_memory_mb,
    peak_method,
    peaks_from_subprocess,
    pin_mmap_threshold,
    write_benchmark_rows,
)
from pipeline_src.taft.losses import get_loss  # noqa: E402
from pipeline_src.taft.tangent_vit import TangentViT  # noqa: E402
from pipeline_src.taft.train import tangent_step  # noqa: E402

NAME = "bench_taft"
PAPER_TRAIN_RATIO = 0.204 / 0.147  # TAFT paper (Liu, Soatto et al., ICLR 2024), Table 8: s per example
TRAIN_RATIO_GOAL = 1.1
TAFT_L2 = 1e-5  # the pipeline's taft `l2` default (methods/registry.py)


def sizes_from_args(args: argparse.Namespace) -> dict:
    if args.vit_b:
        s = dict(img_size=224, patch_size=16, in_chans=3, embed_dim=768, depth=12, num_heads=12, num_classes=100)
    elif args.quick:
        s = dict(img_size=16, patch_size=4, in_chans=3, embed_dim=64, depth=4, num_heads=4, num_classes=10)
    else:
        s = dict(img_size=32, patch_size=4, in_chans=3, embed_dim=192, depth=6, num_heads=3, num_classes=10)
    s["batch"] = args.batch or (8 if args.quick else 32)
    return s


def make_cases(sizes: dict, device: str) -> dict[str, Callable[[], object]]:
    """Name -> zero-argument callable; forward cases run without autograd."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    vit_kw = {k: v for k, v in sizes.items() if k != "batch"}
    base = VisionTransformer(**vit_kw).to(device).eval()
    unfused = copy.deepcopy(base)
    for blk in unfused.blocks:
        blk.attn.fused_attn = False  # forward-mode AD cannot go through fused SDPA
    g = torch.Generator().manual_seed(1)
    x = torch.randn(sizes["batch"], sizes["in_chans"], sizes["img_size"], sizes["img_size"], generator=g).to(device)
    y = torch.randint(0, sizes["num_classes"], (sizes["batch"],), generator=g).to(device)
    loss_fn = get_loss("rsl", 1.0, 15.0)
    ce = get_loss("ce")
    cases: dict[str, Callable[[], object]] = {}

    def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn()
        return run

    cases["plain_forward"] = no_grad(lambda: base(x))
    cases["plain_forward_unfused"] = no_grad(lambda: unfused(x))
    for label, k in (("taft1", 1), ("taftall", sizes["depth"])):
        model = TangentViT(base, k, delta_init_std=1e-3).to(device).eval()
        pairs = model.linearization_pairs()
        names = list(pairs)
        primals = tuple(w for w, _ in pairs.values())
        tangents = tuple(d.detach() for _, d in pairs.values())

        def func_jvp(names=names, primals=primals, tangents=tangents):
            f = lambda *vals: torch.func.functional_call(unfused, dict(zip(names, vals)), (x,))  # noqa: E731
            out, jout = torch.func.jvp(f, primals, tangents)
            return out + jout

        cases[f"tangent_forward_{label}"] = no_grad(lambda model=model: model(x))
        cases[f"funcjvp_forward_{label}"] = no_grad(func_jvp)
        feats = model.prefix(x)
        opt = torch.optim.AdamW(model.delta_parameters(), lr=1e-5, weight_decay=0.0)
        cases[f"train_step_features_{label}"] = (
            lambda model=model, opt=opt, feats=feats: tangent_step(model, opt, feats, y, loss_fn, TAFT_L2))
        cases[f"train_step_features_{label}_autograd"] = (  # ∇ by autograd through the tangent ops
            lambda model=model, opt=opt, feats=feats: tangent_step(model, opt, feats, y, loss_fn, TAFT_L2,
                                                                   through_primal=False))
        cases[f"train_step_images_{label}"] = (
            lambda model=model, opt=opt: tangent_step(model, opt, x, y, loss_fn, TAFT_L2, from_images=True))
        nlft = TailFineTune(copy.deepcopy(base), k).to(device).eval()
        nlft_opt = torch.optim.AdamW([p for p in nlft.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.0)
        cases[f"nlft_train_step_features_{label}"] = (
            lambda nlft=nlft, opt=nlft_opt, feats=feats: nlft_step(nlft, opt, feats, y, ce))
    return cases


def nlft_step(model: TailFineTune, opt: torch.optim.Optimizer, feats: torch.Tensor, y: torch.Tensor,
              loss_fn: Callable) -> float:
    """One NLFT step as `methods/training.fit` takes it: forward from the cached features, loss,
    zero_grad, backward, AdamW."""
    loss = loss_fn(model.forward_from_prefix(feats), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def run_interleaved(cases: dict[str, Callable[[], object]], repeats: int, warmup: int,
                    device: str, clock: str = "wall") -> dict[str, list[float]]:
    """Times (ms) per case, one run of every case per round, rounds repeated.

    clock='process' counts this process's CPU time instead of wall time: with one
    thread it is far less sensitive to other jobs sharing the cores."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    now = time.process_time if clock == "process" else time.perf_counter
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = now()
            fn()
            sync()
            times[name].append((now() - t0) * 1e3)
    return times


def ratio_table(med: dict[str, float], mem: dict[str, float], sizes: dict) -> str:
    """Markdown table of the headline ratios, each beside its goal and its matrix-product floor."""
    def r(a: str, b: str, d: dict) -> str:
        return f"{d[a] / d[b]:.2f}" if d.get(b) else "n/a"

    fl = {k: f"{v:.2f}" for k, v in gemm_floors(sizes).items()}
    lines = ["| comparison | time ratio | peak-memory ratio | goal | floor |", "|---|---|---|---|---|"]
    rows = [
        ("TAFT-1 tangent fwd / plain fwd", "tangent_forward_taft1", "plain_forward", "≤ 1.05 × floor",
         fl["fwd_taft1"]),
        ("TAFT-all tangent fwd / plain fwd", "tangent_forward_taftall", "plain_forward", "≤ 1.05 × floor",
         fl["fwd_taftall"]),
        ("TAFT-1 tangent fwd / plain fwd (unfused)", "tangent_forward_taft1", "plain_forward_unfused", "",
         fl["fwd_taft1"]),
        ("TAFT-all tangent fwd / plain fwd (unfused)", "tangent_forward_taftall", "plain_forward_unfused", "",
         fl["fwd_taftall"]),
        ("TAFT-1 tangent fwd / torch.func.jvp", "tangent_forward_taft1", "funcjvp_forward_taft1", "≤ 0.9", ""),
        ("TAFT-all tangent fwd / torch.func.jvp", "tangent_forward_taftall", "funcjvp_forward_taftall", "≤ 0.9", ""),
        ("TAFT-1 train step: features / images", "train_step_features_taft1", "train_step_images_taft1", "< 1", ""),
        ("TAFT-all train step: features / images", "train_step_features_taftall", "train_step_images_taftall",
         "", ""),
        ("TAFT-1 train step: ∇ through primal / through tangent", "train_step_features_taft1",
         "train_step_features_taft1_autograd", "", ""),
        ("TAFT-all train step: ∇ through primal / through tangent", "train_step_features_taftall",
         "train_step_features_taftall_autograd", "", ""),
        ("TAFT-1 / NLFT-1 train step (features)", "train_step_features_taft1", "nlft_train_step_features_taft1",
         f"≤ {TRAIN_RATIO_GOAL} (paper {PAPER_TRAIN_RATIO:.2f})", fl["train_taft1"]),
        ("TAFT-all / NLFT-all train step (features)", "train_step_features_taftall",
         "nlft_train_step_features_taftall", f"≤ {TRAIN_RATIO_GOAL} (paper {PAPER_TRAIN_RATIO:.2f})",
         fl["train_taftall"]),
    ]
    for label, a, b, goal, floor in rows:
        if a not in med or b not in med:
            continue
        lines.append(f"| {label} | {r(a, b, med)} | {r(a, b, mem)} | {goal} | {floor} |")
    lines.append("")
    lines.append("| case | median ms | steps/s | peak MB |")
    lines.append("|---|---|---|---|")
    for name in med:
        sps = f"{1e3 / med[name]:.2f}" if "train_step" in name else ""
        lines.append(f"| {name} | {med[name]:.1f} | {sps} | {mem[name]:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, few repeats")
    ap.add_argument("--vit-b", action="store_true", help="ViT-B/16 at 224 px (random weights)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="'process' (CPU time; use with --threads 1 on a shared machine) or 'wall'")
    ap.add_argument("--cases", default=None,
                    help="comma-separated substrings; only cases whose name contains one run")
    ap.add_argument("--out-dir", default="results/benchmarks")
    ap.add_argument("--peaks-only", action="store_true",
                    help="internal: print the CPU peak of each case (the timing run starts this)")
    args = ap.parse_args(argv)
    cpu = torch.device(args.device).type == "cpu"
    if args.peaks_only:
        pin_mmap_threshold()  # before anything is allocated: RSS then follows every tensor free
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "process" and torch.device(args.device).type == "cuda":
        ap.error("--clock process measures CPU time; use --clock wall on cuda")
    sizes = sizes_from_args(args)
    repeats = args.repeats or (3 if args.quick else 7)
    cases = make_cases(sizes, args.device)
    if args.cases:
        wanted = args.cases.split(",")
        cases = {n: fn for n, fn in cases.items() if any(w in n for w in wanted)}
        if not cases:
            ap.error(f"--cases {args.cases!r} matches no case")
    if args.peaks_only:
        for fn in cases.values():
            fn()  # as after the timing run's warm-up: optimizer state exists
        emit_peaks({name: peak_memory_mb(fn, args.device) for name, fn in cases.items()})
        return
    times = run_interleaved(cases, repeats, warmup=1, device=args.device, clock=args.clock)
    sizes = {**sizes, "clock": args.clock}
    if cpu:  # in a child process: the pinned mmap threshold would slow the timed allocations
        argv = sys.argv[1:] if argv is None else list(argv)
        mem = peaks_from_subprocess([sys.executable, str(Path(__file__).resolve()), *argv, "--peaks-only"])
    else:
        mem = {name: peak_memory_mb(fn, args.device) for name, fn in cases.items()}
    med = {name: statistics.median(t) for name, t in times.items()}
    how = peak_method(args.device) + (", measured in a child process" if cpu else "")
    rows = [benchmark_row(NAME, name, args.device, sizes, times[name], mem[name], method=how) for name in cases]
    path = write_benchmark_rows(NAME, rows, args.out_dir)
    print(f"device: {rows[0]['device']}; sizes: {json.dumps(sizes)}; repeats: {repeats}")
    print(ratio_table(med, mem, sizes))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
