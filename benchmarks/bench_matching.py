"""Time rotation matching of one model pair against model size (random-weight timm ViTs).

Cases per size:
  match_full               attention rotation + scaling + FFN permutation, all blocks (the goal:
                           ViT-B ≤ 1 s on a GPU, ≤ 10 s on a 2-core CPU)
  match_attention          attention rotation + scaling only (one batched SVD for all blocks)
  match_ffn                FFN permutation only (similarity + assignment per block, in threads)
  similarity_block         `ffn_similarity` of one block (hidden × hidden)
  assignment_block         the certified sparse assignment (`sparse_assignment`) of that block
  hungarian_block          scipy's dense linear_sum_assignment of that block (the previous solver)

Usage:
  python benchmarks/bench_matching.py [--quick] [--device cuda] [--models tiny,vit_b] [--repeats N]
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
import sys
from pathlib import Path

import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_src.matching import match_to_anchor  # noqa: E402
from pipeline_src.matching.ffn_permutation import ffn_similarity  # noqa: E402
from pipeline_src.matching.sparse_assignment import sparse_assignment  # noqa: E402
from pipeline_src.store.benchmark_rows import benchmark_row, peak_memory_mb, time_median, write_benchmark_rows  # noqa: E402

SIZES = {  # name: (embed, depth, heads)
    "tiny": (32, 2, 4),
    "vit_ti": (192, 12, 3),
    "vit_s": (384, 12, 6),
    "vit_b": (768, 12, 12),
}
GOAL_S = {"cpu": 10.0, "cuda": 1.0}  # ViT-B match_full per model pair


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny and ViT-Ti only, 1 repeat")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=",".join(SIZES), help=f"comma list of {list(SIZES)}")
    parser.add_argument("--vit-b", action="store_true", help="make sure ViT-B/16 is included (it is by default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out-dir", default="results/benchmarks")
    args = parser.parse_args()
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
            "match_full": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads),
            "match_attention": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads, ffn=False),
            "match_ffn": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads, attention=False),
        }
        block0 = [sd[f"blocks.0.mlp.{p}"] for sd in (sd_a, sd_b) for p in ("fc1.weight", "fc1.bias", "fc2.weight")]
        sim = ffn_similarity(*block0)
        sim_np = sim.double().cpu().numpy()
        cases["similarity_block"] = lambda: ffn_similarity(*block0)
        cases["assignment_block"] = lambda: sparse_assignment(sim)
        cases["hungarian_block"] = lambda: linear_sum_assignment(sim_np, maximize=True)
        for case, fn in cases.items():
            _, times = time_median(fn, repeats=repeats, warmup=warmup, device=args.device)
            peak = peak_memory_mb(fn, args.device) if case.startswith("match") else float("nan")
            rows.append(benchmark_row("bench_matching", case, args.device, sizes, times, peak))
            print(f"{name:7s} {case:17s} median {rows[-1]['time_ms_median']:10.1f} ms  "
                  f"peak {peak:8.1f} MB  ({n_params / 1e6:.1f} M params)", flush=True)
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
