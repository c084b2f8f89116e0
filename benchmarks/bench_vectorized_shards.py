"""Benchmark: N shard models of fc, nlft-k, last and taft-k trained stacked in one call
(`methods.vectorized.train_shards_vectorized`; taft: `taft.train.train_tangent_vectorized`) against the same N trained one after another by the
method's own `train` (what N per-shard jobs compute, without their fixed cost of start and load).

The backbone is the Fashion-MNIST study's (28 px, patch 7, D 96, depth 4, 4 heads; random
weights), features as its cache holds them (float32), batch 32, one epoch. Cases per
(kind, N, shard size): `separate` and `vectorized`, timed interleaved; rows record the median
of `--repeats`. The vectorized path pays when its time is below `separate` plus the N - 1 job
starts it saves (README "Where a study's time goes": about 0.6 s a job outside its step).

    python benchmarks/bench_vectorized_shards.py [--quick] [--threads 1] [--shards 2,10,25 --sizes 32,96,400]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from pipeline_src.methods.registry import build_tuned_model, get_method, taft_options  # noqa: E402
from pipeline_src.methods.vectorized import train_shards_vectorized  # noqa: E402
from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows  # noqa: E402
from pipeline_src.taft.train import train_tangent_vectorized  # noqa: E402

ARCH = dict(img_size=28, patch_size=7, in_chans=1, num_classes=5, embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0)
METHODS = {"fc": {"kind": "fc"}, "nlft-1": {"kind": "nlft", "k": 1},
           "last": {"kind": "last", "rank": 16, "heads": 4, "every": 2, "modules_per_block": 2},
           "taft-1": {"kind": "taft", "k": 1, "kappa": 15},
           # deeper tuned parts (k = 4: every block of the depth-4 backbone, the default study's nlft-4, taft-4)
           "nlft-2": {"kind": "nlft", "k": 2}, "taft-2": {"kind": "taft", "k": 2, "kappa": 15},
           "nlft-4": {"kind": "nlft", "k": 4}, "taft-4": {"kind": "taft", "k": 4, "kappa": 15}}
SETTINGS = {"epochs": 1, "batch_size": 32, "lr": 1e-3, "weight_decay": 0.0, "schedule": None}


def run(methods: list[str], counts: list[int], sizes: list[int], repeats: int) -> list[dict]:
    torch.manual_seed(0)
    backbone = VisionTransformer(**ARCH).eval()
    rows = []
    for name in methods:
        cfg = METHODS[name]
        model = build_tuned_model(backbone, cfg, 5, seed=0)
        for size in sizes:
            feats = model.prefix(torch.randn(size, 1, 28, 28))  # one shard's features, reused by every shard
            labels = torch.randint(0, 5, (size,))
            for n in counts:
                shards = [(feats, labels)] * n
                settings = {**SETTINGS, "method": cfg}

                def separate() -> None:
                    for i in range(n):
                        get_method(cfg["kind"]).train(build_tuned_model(backbone, cfg, 5, seed=0), feats, labels,
                                                      settings, i, "bench")

                def vectorized() -> None:
                    fresh = build_tuned_model(backbone, cfg, 5, seed=0)
                    if cfg["kind"] == "taft":  # its own vectorized trainer, as steps/train_vectorized.py calls it
                        o = taft_options(cfg)
                        train_tangent_vectorized(fresh, shards, epochs=SETTINGS["epochs"],
                                                 batch_size=SETTINGS["batch_size"], lr=SETTINGS["lr"],
                                                 weight_decay_l2=o["l2"], loss=o["loss"], alpha=o["alpha"],
                                                 kappa=o["kappa"], radius=o["radius"], seed=list(range(n)))
                    else:
                        train_shards_vectorized(fresh, cfg, shards, settings, list(range(n)))

                times: dict[str, list[float]] = {"separate": [], "vectorized": []}
                for _ in range(repeats):  # interleaved: both cases see the same machine load
                    for case, fn in (("separate", separate), ("vectorized", vectorized)):
                        t0 = time.perf_counter()
                        fn()
                        times[case].append((time.perf_counter() - t0) * 1e3)
                shape = {"method": name, "shards": n, "shard_size": size, "batch_size": SETTINGS["batch_size"],
                         "epochs": SETTINGS["epochs"], "threads": torch.get_num_threads(), "arch": ARCH}
                for case, t in times.items():
                    rows.append(benchmark_row("vectorized_shards", case, "cpu", shape, t, None,
                                              not_measured="time only: the per-shard jobs' memory is the step's"))
                s, v = statistics.median(times["separate"]), statistics.median(times["vectorized"])
                print(f"{name:7s} N {n:3d} shard {size:4d}: separate {s:8.1f} ms  vectorized {v:8.1f} ms  "
                      f"ratio {v / s:5.2f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes, 1 repeat (a smoke run)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--shards", default="2,10,25", help="shard counts N, comma-separated")
    ap.add_argument("--sizes", default="32,96,400", help="samples per shard, comma-separated")
    ap.add_argument("--out", default="results/benchmarks")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        counts, sizes, repeats = [2, 4], [32], 1
    else:
        counts, sizes = [int(v) for v in args.shards.split(",")], [int(v) for v in args.sizes.split(",")]
        repeats = args.repeats
    rows = run(args.methods.split(","), counts, sizes, repeats)
    print(write_benchmark_rows("vectorized_shards", rows, args.out))


if __name__ == "__main__":
    main()
