"""The frozen prefix: read it from the feature cache, or recompute it? (issue 34, item 4)

A TAFT-k / NLFT-k / LAST job needs the frozen prefix's output (blocks 0 .. depth-k) for every
image of every epoch. The `features` rule computes it once and caches it; a job then reads
tokens x dim values an image (ViT-B/16 at 224 px in bfloat16: 197 x 768 x 2 = 302 KB) where
recomputing reads a 150 KB uint8 image and runs depth-k blocks. This script times both for one
batch stream on one device, through the pipeline's own code paths:

    cache      `CachedRows` over a `FeatureCacheWriter` file (what `train` reads with
               `features.cache: true`): batches of rows in a shuffled order, moved to the device.
               `--cold` drops the page cache before each repeat (root only; the row says whether
               it could), so reads come from the disk, as for a cache larger than memory.
    recompute  uint8 images (pinned host memory) -> device -> normalise -> patch embed -> the
               prefix's blocks, under no_grad and the job's autocast dtype.

Rows (median of --repeats) go to <out-dir>/prefix.parquet: device, model, img size, batch, k,
mode, images/s, and the bytes an image each mode moves. The rule: recompute when its images/s
is the larger.

    python benchmarks/bench_prefix.py --device cuda                  # ViT-B/16, 224 px, k = 1
    python benchmarks/bench_prefix.py --smoke                        # CPU, ViT-Ti at 32 px: checks the script
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import timm
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline_src.data.feature_cache import CachedRows, FeatureCache, FeatureCacheWriter  # noqa: E402
from pipeline_src.store.atomic import write_parquet  # noqa: E402


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def prefix(model: torch.nn.Module, x: torch.Tensor, k: int) -> torch.Tensor:
    """Tokens after the frozen prefix: (B, C, H, W) -> (B, tokens, dim)."""
    x = model.patch_embed(x)
    x = model._pos_embed(x)
    x = model.norm_pre(x)
    for block in model.blocks[: len(model.blocks) - k]:
        x = block(x)
    return x


def drop_page_cache() -> bool:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--images", type=int, default=4096, help="images in the stream (and rows in the cache)")
    p.add_argument("--k", type=int, default=1, help="blocks after the prefix (TAFT-k)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="also time the cache with the page cache dropped")
    p.add_argument("--workdir", default=None, help="where the cache file goes (default: a temp folder)")
    p.add_argument("--out-dir", default="results/benchmarks")
    p.add_argument("--smoke", action="store_true", help="CPU, ViT-Ti at 32 px, 64 images")
    args = p.parse_args()
    if args.smoke:
        args.model, args.img_size, args.batch, args.images, args.device = "vit_tiny_patch16_224", 32, 16, 64, "cpu"
        args.repeats = 1
    device = torch.device(args.device)
    amp = getattr(torch, args.dtype)
    model = timm.create_model(args.model, pretrained=False, img_size=args.img_size, num_classes=10).to(device).eval()
    tokens, dim = model.patch_embed.num_patches + model.num_prefix_tokens, model.embed_dim
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (args.images, 3, args.img_size, args.img_size), dtype=np.uint8))
    if device.type == "cuda":
        images = images.pin_memory()
    mean = torch.tensor([0.5, 0.5, 0.5], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.5, 0.5, 0.5], device=device).view(1, 3, 1, 1)

    def recompute_pass() -> None:
        for start in range(0, args.images, args.batch):
            x = images[start:start + args.batch].to(device, non_blocking=True)
            x = (x.float() / 255 - mean) / std
            with torch.autocast(device.type, dtype=amp, enabled=args.dtype != "float32"):
                prefix(model, x, args.k)
        sync(device)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_prefix_"))
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "features.npy"
    writer = FeatureCacheWriter(path, (args.images, tokens, dim), args.dtype, {"bench": True})
    for start in range(0, args.images, args.batch):  # the cache holds the real prefix outputs
        x = (images[start:start + args.batch].to(device).float() / 255 - mean) / std
        with torch.autocast(device.type, dtype=amp, enabled=args.dtype != "float32"):
            writer.write(start, prefix(model, x, args.k).float())
    writer.close()
    order = torch.from_numpy(rng.permutation(args.images))
    cached = CachedRows(FeatureCache(path), np.arange(args.images), device=device)

    def cache_pass() -> None:
        for start in range(0, args.images, args.batch):
            cached[order[start:start + args.batch]]
        sync(device)

    rows = []
    modes = [("recompute", recompute_pass, None), ("cache", cache_pass, False)]
    if args.cold:
        modes.append(("cache_cold", cache_pass, True))
    recompute_pass()  # warm-up: kernels, allocator, page cache
    cache_pass()
    for mode, fn, cold in modes:
        times, dropped = [], None
        for _ in range(args.repeats):
            if cold:
                dropped = drop_page_cache()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        wall = statistics.median(times)
        bytes_per_image = (3 * args.img_size ** 2) if mode == "recompute" else tokens * dim * np.dtype(
            np.float32 if args.dtype == "float32" else np.float16).itemsize
        rows.append({"benchmark": "prefix", "device": device_name(device), "model": args.model,
                     "img_size": args.img_size, "batch": args.batch, "images": args.images, "k": args.k,
                     "prefix_blocks": len(model.blocks) - args.k, "dtype": args.dtype, "mode": mode,
                     "page_cache_dropped": dropped, "repeats": args.repeats, "wall_s": wall,
                     "images_per_s": args.images / wall, "bytes_per_image": int(bytes_per_image)})
        print(f"{mode:11s} {args.images / wall:10.1f} images/s  ({bytes_per_image / 1e3:.0f} KB an image"
              f"{'' if dropped is None else f', page cache dropped: {dropped}'})", flush=True)
    best = max(rows, key=lambda r: r["images_per_s"])
    print(f"faster: {best['mode']} on {best['device']}")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(pa.Table.from_pylist(rows), out / "prefix.parquet")


if __name__ == "__main__":
    main()
