"""Where a shard job's training time goes when it trains from the feature cache (issue 41, item 4):
torch.profiler over `methods.training.fit` on a `CachedRows` view, the real loop and the real
reader, split into reading and converting the batch's rows (`CachedRows.__getitem__`) and the
rest (forward, backward, AdamW). The model is the Fashion-MNIST study's trained part at k = 1
(one timm block of width 96, 4 heads, MLP ratio 2, on 16 patch tokens + CLS, and a linear head).

Writes one row per view (per-batch reads; on a GPU also the resident view) to <out-dir>/profile_cached_epoch.parquet: the profiled
CPU time of the reads and of the whole epoch (self CPU time summed over ops), and the wall time.

    python benchmarks/profile_cached_epoch.py                 # CPU, 1,500 rows, batch 32, 2 epochs
    python benchmarks/profile_cached_epoch.py --device cuda   # also the GPU's resident view
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from timm.models.vision_transformer import Block

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline_src.data.feature_cache import CachedRows, FeatureCache, FeatureCacheWriter  # noqa: E402
from pipeline_src.methods.training import fit  # noqa: E402
from pipeline_src.store.atomic import write_parquet  # noqa: E402


class ProfiledRows(CachedRows):
    """`CachedRows` whose batch reads show in the profile as `read_rows`."""

    def __getitem__(self, idx):
        with torch.profiler.record_function("read_rows"):
            return super().__getitem__(idx)


def profile(cache: FeatureCache, rows: np.ndarray, device: str, resident: bool, args) -> dict:
    torch.manual_seed(0)
    block, head = Block(args.dim, 4, mlp_ratio=2.0).to(device), torch.nn.Linear(args.dim, 5).to(device)
    view = ProfiledRows(cache, rows, device, resident=resident)
    labels = torch.randint(0, 5, (len(rows),), device=device)
    params = [*block.parameters(), *head.parameters()]
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    t = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        fit(lambda x: head(block(x)[:, 0]), params, view, labels, epochs=args.epochs, batch_size=args.batch,
            lr=1e-3, weight_decay=0.0, seed=0)
    wall = time.perf_counter() - t
    events = prof.key_averages()
    reads = sum(e.cpu_time_total for e in events if e.key == "read_rows") / 1e6
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    return {"device": device, "resident": resident, "rows": len(rows), "batch": args.batch, "epochs": args.epochs,
            "read_cpu_s": reads, "profiled_cpu_s": total, "read_share_pct": 100 * reads / total, "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", type=int, default=1500)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--tokens", type=int, default=17)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()
    torch.set_num_threads(1)  # a shard job's one thread
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "features.npy"
        w = FeatureCacheWriter(path, (args.rows * 2, args.tokens, args.dim), "float16", {"cache": "last1"})
        w.write(0, torch.randn(args.rows * 2, args.tokens, args.dim))
        w.close()
        rows = np.random.default_rng(0).permutation(args.rows * 2)[:args.rows]  # a shard's scattered rows
        for resident in (False, True) if args.device == "cuda" else (False,):  # resident: the GPU's view
            row = profile(FeatureCache(path), rows, args.device, resident, args)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
            out.append(row)
    write_parquet(pa.Table.from_pylist(out), Path(args.out_dir) / "profile_cached_epoch.parquet")


if __name__ == "__main__":
    main()
