"""Time rotation matching of one model pair against model size (random-weight timm ViTs).

Cases per size:
  match_full        attention rotation + scaling + FFN permutation, all blocks
  match_attention   attention rotation + scaling only (batched per-head SVDs)
  match_ffn         FFN permutation only (similarity + Hungarian per block)
  hungarian_block   scipy linear_sum_assignment on one block's (hidden × hidden) similarity

Usage:
  python benchmarks/bench_matching.py [--quick] [--device cuda] [--vit-b] [--repeats N]
Default sizes (tiny, ViT-Ti, ViT-S) finish in a few minutes on a 2-core CPU; --vit-b adds
ViT-B/16 (768 wide, 12 blocks, 3072 hidden). On a shared, oversubscribed CPU, OpenMP spin-waiting
inflates small-op timings many times; run with OMP_WAIT_POLICY=PASSIVE (or --threads 1). Rows go to
results/benchmarks/bench_matching_<cpu|cuda>.parquet.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_src.benchmark_rows import benchmark_row, peak_memory_mb, time_median, write_benchmark_rows  # noqa: E402
from pipeline_src.matching import match_to_anchor  # noqa: E402
from pipeline_src.matching.ffn_permutation import ffn_similarity  # noqa: E402

SIZES = {  # name: (embed, depth, heads)
    "tiny": (32, 2, 4),
    "vit_ti": (192, 12, 3),
    "vit_s": (384, 12, 6),
    "vit_b": (768, 12, 12),
}


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
    parser.add_argument("--vit-b", action="store_true", help="add ViT-B/16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out-dir", default="results/benchmarks")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = ["tiny", "vit_ti"] if args.quick else ["tiny", "vit_ti", "vit_s"]
    if args.vit_b:
        names.append("vit_b")
    repeats, warmup = (1, 0) if args.quick else (args.repeats, 1)
    rows = []
    for name in names:
        embed, depth, heads = SIZES[name]
        sd_a = random_state_dict(embed, depth, heads, 0, args.device)
        sd_b = random_state_dict(embed, depth, heads, 1, args.device)
        n_params = sum(v.numel() for v in sd_a.values())
        sizes = {"model": name, "embed": embed, "depth": depth, "heads": heads, "hidden": 4 * embed,
                 "params": n_params}
        cases = {
            "match_full": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads),
            "match_attention": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads, ffn=False),
            "match_ffn": lambda: match_to_anchor(sd_a, sd_b, num_heads=heads, attention=False),
        }
        sim = ffn_similarity(*(sd[f"blocks.0.mlp.{p}"] for sd in (sd_a, sd_b)
                               for p in ("fc1.weight", "fc1.bias", "fc2.weight"))).double().cpu().numpy()
        cases["hungarian_block"] = lambda: linear_sum_assignment(sim, maximize=True)
        for case, fn in cases.items():
            _, times = time_median(fn, repeats=repeats, warmup=warmup, device=args.device)
            peak = peak_memory_mb(fn, args.device) if case != "hungarian_block" else float("nan")
            rows.append(benchmark_row("bench_matching", case, args.device, sizes, times, peak))
            print(f"{name:7s} {case:16s} median {rows[-1]['time_ms_median']:10.1f} ms  "
                  f"peak {peak:8.1f} MB  ({n_params / 1e6:.1f} M params)", flush=True)
    # one file per device type, so CPU and GPU runs do not overwrite each other
    path = write_benchmark_rows(f"bench_matching_{torch.device(args.device).type}", rows, args.out_dir)
    print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
