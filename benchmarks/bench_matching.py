"""Time rotation matching of one model pair against model size (random-weight timm ViTs).

Cases per size:
  match_full               attention rotation + scaling + FFN permutation, all blocks (the goal:
                           ViT-B ≤ 1 s on a GPU, ≤ 5 s on a 2-core CPU)
  match_attention          attention rotation + scaling only (one batched SVD for all blocks)
  match_ffn                FFN permutation only (similarity + assignment per block, in threads)
  similarity_block         `ffn_similarity` of one block (hidden × hidden)
  assignment_block         the certified sparse assignment (`sparse_assignment`) of that block
  hungarian_block          scipy's dense linear_sum_assignment of that block (the previous solver)

With --threshold it instead times the certified sparse assignment against scipy's dense solver
on FFN similarities of random blocks at hidden widths 256..3072 (one thread, process CPU time,
interleaved): the measurement behind `sparse_assignment.DENSE_BELOW`.

Usage:
  python benchmarks/bench_matching.py [--quick] [--device cuda] [--models tiny,vit_b] [--repeats N]
  python benchmarks/bench_matching.py --threshold [--widths 256,512,768,1024,1536,2048,3072]
The default sizes (tiny, ViT-Ti, ViT-S, ViT-B/16: 768 wide, 12 blocks, 3072 hidden) take a few
minutes on a 2-core CPU and print the ViT-B match_full time against the goal; --vit-b is kept for
scripts (ViT-B is in the default). On a shared, oversubscribed CPU, OpenMP spin-waiting inflates
small-op timings many times; run with OMP_WAIT_POLICY=PASSIVE (or --threads 1). Rows go to
results/benchmarks/bench_matching_<cpu|cuda>.parquet.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_src.matching import match_to_anchor  # noqa: E402
from pipeline_src.matching import sparse_assignment as sparse_module  # noqa: E402
from pipeline_src.matching.ffn_permutation import ffn_similarity  # noqa: E402
from pipeline_src.matching.sparse_assignment import sparse_assignment  # noqa: E402
from pipeline_src.store.benchmark_rows import benchmark_row, peak_memory_mb, time_median, write_benchmark_rows  # noqa: E402

SIZES = {  # name: (embed, depth, heads)
    "tiny": (32, 2, 4),
    "vit_ti": (192, 12, 3),
    "vit_s": (384, 12, 6),
    "vit_b": (768, 12, 12),
}
GOAL_S = {"cpu": 5.0, "cuda": 1.0}  # ViT-B match_full per model pair


def random_state_dict(embed: int, depth: int, heads: int, seed: int, device: str) -> dict:
    """Random ViT/16 (224 px) weights: timm's init plus random biases, so no term is trivially zero."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    model = VisionTransformer(img_size=224, patch_size=16, embed_dim=embed, depth=depth, num_heads=heads,
                              num_classes=1000)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    for k, v in sd.items():
        if k.endswith(".bias"):
            sd[k] = torch.randn_like(v) * 0.02
    return {k: v.to(device) for k, v in sd.items()}


def row_with_peak(case: str, device: str, sizes: dict, times: list[float], fn) -> dict:
    """A row with `fn`'s measured peak; a case too small to move the peak gets no figure
    (benchmark_row refuses a zero peak) but says why."""
    peak = peak_memory_mb(fn, device)
    try:
        return benchmark_row("bench_matching", case, device, sizes, times, peak)
    except ValueError:
        return benchmark_row("bench_matching", case, device, sizes, times, None,
                             not_measured=f"peak growth {peak:.2f} MB is below what the allocator shows")


def threshold_rows(widths: list[int], repeats: int, device: str) -> list[dict]:
    """Sparse vs dense assignment time per FFN width, process CPU time, interleaved, one thread."""
    torch.set_num_threads(1)
    rows = []
    for hidden in widths:
        embed = hidden // 4
        sds = [random_state_dict(embed, 1, max(1, embed // 64), s, device) for s in (0, 1)]
        sim = ffn_similarity(*[sd[f"blocks.0.mlp.{p}"] for sd in sds for p in ("fc1.weight", "fc1.bias", "fc2.weight")])
        sim_np = sim.double().cpu().numpy()
        below, sparse_module.DENSE_BELOW = sparse_module.DENSE_BELOW, 0  # force the sparse path
        try:
            fns = {"threshold_sparse": lambda: sparse_assignment(sim),
                   "threshold_dense": lambda: linear_sum_assignment(sim_np, maximize=True)}
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(repeats):
                for case, fn in fns.items():
                    t0 = time.process_time()
                    fn()
                    times[case].append((time.process_time() - t0) * 1e3)
            sizes = {"hidden": hidden, "threads": 1, "clock": "process"}
            rows += [row_with_peak(case, device, sizes, times[case], fn) for case, fn in fns.items()]
        finally:
            sparse_module.DENSE_BELOW = below
        sp, de = (statistics.median(times[c]) for c in fns)
        print(f"hidden {hidden:5d}  sparse {sp:8.1f} ms  dense {de:8.1f} ms  dense/sparse {de / sp:5.2f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny and ViT-Ti only, 1 repeat")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=",".join(SIZES), help=f"comma list of {list(SIZES)}")
    parser.add_argument("--vit-b", action="store_true", help="make sure ViT-B/16 is included (it is by default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--threshold", action="store_true", help="time sparse vs dense assignment per width only")
    parser.add_argument("--widths", default="256,384,512,640,768,1024,1536,2048,3072")
    parser.add_argument("--out-dir", default="results/benchmarks")
    args = parser.parse_args()
    if args.threshold:
        rows = threshold_rows([int(w) for w in args.widths.split(",")], max(args.repeats, 5), args.device)
        path = write_benchmark_rows(f"bench_matching_threshold_{torch.device(args.device).type}", rows, args.out_dir)
        print(f"DENSE_BELOW is {sparse_module.DENSE_BELOW}; wrote {len(rows)} rows to {path}")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    names = ["tiny", "vit_ti"] if args.quick else [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(SIZES))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(SIZES)}")
    if args.vit_b and "vit_b" not in names:
        names.append("vit_b")
    repeats, warmup = (1, 0) if args.quick else (args.repeats, 1)
    rows = []
    for name in names:
        embed, depth, heads = SIZES[name]
        sd_a = random_state_dict(embed, depth, heads, 0, args.device)
        sd_b = random_state_dict(embed, depth, heads, 1, args.device)
        n_params = sum(v.numel() for v in sd_a.values())
        sizes = {"model": name, "embed": embed, "depth": depth, "heads": heads, "hidden": 4 * embed,
                 "params": n_params, "workers": os.cpu_count()}  # match_to_anchor's default FFN threads
        cases = {
            "match_full": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads, plain_attention=True),
            "match_attention": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads, ffn=False, plain_attention=True),
            "match_ffn": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads, attention=False, plain_attention=True),
        }
        block0 = [sd[f"blocks.0.mlp.{p}"] for sd in (sd_a, sd_b) for p in ("fc1.weight", "fc1.bias", "fc2.weight")]
        sim = ffn_similarity(*block0)
        sim_np = sim.double().cpu().numpy()
        cases["similarity_block"] = lambda: ffn_similarity(*block0)
        cases["assignment_block"] = lambda: sparse_assignment(sim)
        cases["hungarian_block"] = lambda: linear_sum_assignment(sim_np, maximize=True)
        for case, fn in cases.items():
            _, times = time_median(fn, repeats=repeats, warmup=warmup, device=args.device)
            rows.append(row_with_peak(case, args.device, sizes, times, fn))
            peak = rows[-1]["peak_mem_mb"]
            print(f"{name:7s} {case:17s} median {rows[-1]['time_ms_median']:10.1f} ms  "
                  f"peak {peak or float('nan'):8.1f} MB  ({n_params / 1e6:.1f} M params)", flush=True)
    kind = torch.device(args.device).type
    goal = GOAL_S.get(kind, GOAL_S["cpu"])
    for row in rows:
        if row["case"] == "match_full" and json.loads(row["sizes"])["model"] == "vit_b":
            secs = row["time_ms_median"] / 1e3
            print(f"goal: ViT-B match_full {secs:.2f} s on {row['device']} "
                  f"({'within' if secs <= goal else 'OVER'} the {goal:g} s goal)")
    # one file per device type, so CPU and GPU runs do not overwrite each other
    path = write_benchmark_rows(f"bench_matching_{kind}", rows, args.out_dir)
    print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
