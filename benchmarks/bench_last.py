"""Benchmark: training memory and step time of LAST vs full fine-tuning and NLFT-1.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024 -- claims ~30% of the memory and ~60% of the
time of other PEFT methods, and many side networks trained in parallel.

Cases (one AdamW step at `--batch`, random weights, cross-entropy):
    full        every backbone parameter trains
    nlft1       only the last block, the final norm and the head train
    last        backbone no-grad forward (features NOT cached) + one side network step
    last_cached one side network step on precomputed features (the pipeline's cached path)
    grid16      backbone no-grad forward + one vectorized step of 16 side networks
                (same architecture, different learning rates and seeds)

peak_mem_mb = resident bytes (backbone + trainable parameters + AdamW state) + the step's
peak extra allocation, i.e. training memory excluding the CUDA context and allocator caching.
The step's peak is `benchmark_rows.peak_memory_mb` on CUDA (max allocated above the
baseline). On CPU (Linux, glibc) it is the peak RSS growth of the step (VmHWM after
resetting it via /proc/self/clear_refs, minus VmRSS before). For that the script pins
glibc's mmap threshold at 128 KiB (mallopt) before allocating anything, so every tensor is
its own mapping and a freed tensor leaves the RSS at once (glibc's default threshold
grows with use and then keeps freed tensors in the heap).
The profiler-based CPU path of `peak_memory_mb` was not used: it misses the frees of
autograd-saved tensors (it reported 185 MB for five Linear fwd/bwd passes on an 8 MB input).

Cases run interleaved (one step of each per round; medians over rounds). The rows record wall
time, or with --clock process (CPU, --threads 1) the process CPU time, which is steadier on a
shared machine; both are printed.

    python benchmarks/bench_last.py [--quick] [--threads 1 --clock process] [--cases last,grid] [--attention bmm]
    python benchmarks/bench_last.py --vit-b --device cuda
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from pipeline_src.last import SideGrid, SideNetwork, extract_features, feature_keys, small_head_attention  # noqa: E402
from pipeline_src.store.benchmark_rows import (  # noqa: E402
    benchmark_row,
    peak_memory_mb,
    pin_mmap_threshold,
    write_benchmark_rows,
)
from pipeline_src.store.job_counters import flop_counter  # noqa: E402


def tensor_mb(tensors: Iterable[torch.Tensor]) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def _proc_status_mb(key: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) / 1024


def cpu_peak_rss_mb(fn: Callable[[], None]) -> float:
    """Peak RSS growth of one `fn()` call (Linux + glibc, after `pin_mmap_threshold`)."""
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _proc_status_mb("VmRSS")
    fn()
    return _proc_status_mb("VmHWM") - base


def step_peak_mb(fn: Callable[[], None], device: str) -> float:
    if torch.device(device).type == "cuda":
        return peak_memory_mb(fn, device=device)
    return cpu_peak_rss_mb(fn)


def time_wall_cpu(fn: Callable[[], None], repeats: int, warmup: int, device: str) -> tuple[list[float], list[float]]:
    """Wall-clock and process-CPU milliseconds of `repeats` calls of `fn()` after `warmup` calls."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return wall, cpu


def adam_state_mb(opt: torch.optim.Optimizer) -> float:
    return tensor_mb(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)


def backbone_step(vit: VisionTransformer, trainable: Callable[[str], bool]) -> tuple[Callable, torch.optim.Optimizer]:
    """A training step of the backbone with the parameters selected by name trainable."""
    for name, p in vit.named_parameters():
        p.requires_grad_(trainable(name))
    opt = torch.optim.AdamW([p for p in vit.parameters() if p.requires_grad], lr=1e-4)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = F.cross_entropy(vit(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step, opt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats, depth 4")
    ap.add_argument("--vit-b", action="store_true", help="ViT-B/16 at 224 px (random weights)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--modules", type=int, default=1, help="T, LSA modules per side block")
    ap.add_argument("--grid", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--cases", default="full,nlft1,last,last_cached,grid",
                    help="comma-separated subset of full,nlft1,last,last_cached,grid")
    ap.add_argument("--clock", choices=["wall", "process"], default="wall",
                    help="what the rows record: wall time, or process CPU time (CPU with --threads 1)")
    ap.add_argument("--attention", choices=["auto", "sdpa", "bmm"], default="auto",
                    help="grid attention path: the per-device table of small_head_attention.py, or forced")
    ap.add_argument("--out-dir", default="results/benchmarks")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cases = set(args.cases.split(","))
    unknown = cases - {"full", "nlft1", "last", "last_cached", "grid"}
    if unknown:
        ap.error(f"unknown --cases {sorted(unknown)}")
    if args.clock == "process" and (dev.type != "cpu" or args.threads != 1):
        ap.error("--clock process needs --device cpu and --threads 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.attention != "auto":
        small_head_attention.ATTENTION_PATH[dev.type] = args.attention
    if dev.type == "cpu":
        pin_mmap_threshold()
    if args.vit_b:
        vit_kw = dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12)
    else:
        vit_kw = dict(img_size=32, patch_size=4, embed_dim=192, depth=4 if args.quick else 6, num_heads=3)
    num_classes = 10
    repeats = args.repeats or (2 if args.quick else 3)
    sizes = dict(attention=small_head_attention.ATTENTION_PATH.get(dev.type, "sdpa"), batch=args.batch, num_classes=num_classes, rank=args.rank, heads=args.heads, every=args.every,
                 modules_per_block=args.modules, grid=args.grid, **vit_kw)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, vit_kw["img_size"], vit_kw["img_size"], device=dev)
    y = torch.randint(0, num_classes, (args.batch,), device=dev)

    def make_vit() -> VisionTransformer:
        torch.manual_seed(0)
        return VisionTransformer(num_classes=num_classes, **vit_kw).to(dev)

    results: dict[str, tuple[float, float, float]] = {}  # case -> (peak MB, median wall ms, median CPU ms)
    rows = []

    registered: dict[str, tuple[Callable[[], None], Callable[[], float]]] = {}

    def measure(case: str, step: Callable[[], None], resident: Callable[[], float]) -> None:
        registered[case] = (step, resident)  # timed below, interleaved with the other cases

    # Full fine-tuning and NLFT-1 (last block + norm + head).
    depth = vit_kw["depth"]
    for case, trainable in (("full", lambda n: True),
                            ("nlft1", lambda n: n.startswith((f"blocks.{depth - 1}.", "norm.", "fc_norm.", "head.")))):
        if case not in cases:
            continue
        vit = make_vit()
        step, opt = backbone_step(vit, trainable)
        measure(case, lambda step=step, vit=vit, opt=opt: step(x, y),
                lambda vit=vit, opt=opt: tensor_mb(vit.parameters()) + adam_state_mb(opt))

    # LAST: the backbone is a frozen feature extractor (no parameter requires grad).
    vit = make_vit().requires_grad_(False)
    side_kw = dict(rank=args.rank, heads=args.heads, every=args.every, modules_per_block=args.modules,
                   num_classes=num_classes)
    side = SideNetwork(vit, **side_kw)
    opt = torch.optim.AdamW(side.parameters(), lr=1e-3)

    def side_step(feats: list[torch.Tensor]) -> None:
        loss = F.cross_entropy(side(feats), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    cached = extract_features(vit, x, every=args.every)
    resident_last = lambda: tensor_mb(vit.parameters()) + tensor_mb(side.parameters()) + adam_state_mb(opt)  # noqa: E731
    if "last" in cases:
        measure("last", lambda: side_step(extract_features(vit, x, every=args.every)), resident_last)
    if "last_cached" in cases:
        measure("last_cached", lambda: side_step(cached), lambda: resident_last() + tensor_mb(cached))

    members = [dict(rank=args.rank, heads=args.heads, every=args.every, modules_per_block=args.modules,
                    lr=10 ** (-2 - 2 * i / max(args.grid - 1, 1)), seed=i) for i in range(args.grid)]
    keys = feature_keys(depth, args.every)
    grid_case = f"grid{args.grid}"
    if "grid" in cases:
        grid = SideGrid(vit, members, num_classes=num_classes)

        def grid_step() -> None:
            grid.step(dict(zip(keys, extract_features(vit, x, every=args.every))), y)

        measure(grid_case, grid_step, lambda: tensor_mb(vit.parameters()) + sum(
            tensor_mb([g.flat, g.exp_avg, g.exp_avg_sq]) for g in grid.groups))

    # Interleaved rounds (one step of every case per round), so load from other processes hits all
    # cases alike; medians over rounds. Warm-up steps allocate the AdamW state.
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for step, _ in registered.values():
        for _ in range(2):
            step()
    sync()
    wall: dict[str, list[float]] = {c: [] for c in registered}
    cpu: dict[str, list[float]] = {c: [] for c in registered}
    for _ in range(repeats):
        for case, (step, _) in registered.items():
            w, c = time_wall_cpu(step, repeats=1, warmup=0, device=args.device)
            wall[case] += w
            cpu[case] += c
    for case, (step, resident) in registered.items():
        res, transient = resident(), step_peak_mb(step, args.device)
        peak = res + transient
        times = cpu[case] if args.clock == "process" else wall[case]
        results[case] = (peak, statistics.median(wall[case]), statistics.median(cpu[case]))
        rows.append(benchmark_row("bench_last", case, args.device, {**sizes, "clock": args.clock}, times, peak))
        cpu_txt = f" (cpu {results[case][2]:9.2f} ms)" if dev.type == "cpu" else ""
        print(f"{case:12s} step {results[case][1]:9.2f} ms{cpu_txt}   peak {peak:9.1f} MB "
              f"(resident {res:.1f} + step {transient:.1f})", flush=True)

    path = write_benchmark_rows("bench_last", rows, out_dir=args.out_dir)
    print(f"\nwrote {path}")
    if "full" in results:
        full_mem, full_t, full_c = results["full"]
        print("ratios vs full fine-tuning (memory, median step time)")
        for case, (mem, t, c) in results.items():
            cpu_txt = f"   cpu time {c / full_c:6.1%}" if dev.type == "cpu" else ""
            print(f"  {case:12s} memory {mem / full_mem:6.1%}   time {t / full_t:6.1%}{cpu_txt}")
    if "last" in results and grid_case in results:
        (one_mem, one_t, one_c), (g_mem, g_t, g_c) = results["last"], results[grid_case]
        cpu_txt = f"   cpu time {g_c / one_c:.2f}x" if dev.type == "cpu" else ""
        print(f"  {grid_case} vs one LAST network: memory {g_mem / one_mem:.2f}x   time {g_t / one_t:.2f}x{cpu_txt}")
    print("  goals: LAST memory <= 25% and time <= 50% of full FT; grid16 <= 3x one network")
    if "last" in registered and grid_case in registered:
        # The arithmetic of the grid ratio: FLOPs per step (the jobs' counter), attention apart.
        print("model FLOPs per step (torch's formulas; attention = SDPA forward + backward):")
        counts = {}
        for case in ("last", grid_case):
            with flop_counter() as fc:
                registered[case][0]()
            attn = sum(v for k, v in fc.flops_by_op.items() if "attention" in k)
            counts[case] = (fc.get_total_flops(), attn)
            print(f"  {case:12s} {fc.get_total_flops() / 1e9:8.3f} GFLOP, of which attention {attn / 1e9:.3f}")
        (one, one_a), (grid_f, grid_a) = counts["last"], counts[grid_case]
        print(f"  non-attention FLOPs {grid_case} / one network: {(grid_f - grid_a) / (one - one_a):.2f}x")


if __name__ == "__main__":
    main()
