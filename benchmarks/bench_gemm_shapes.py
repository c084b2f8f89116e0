"""Benchmark: where a shard model's training time goes, and the ceiling its matrix shapes put on
the efficiency table's `in_step_peak_pct` (issue 34's goal: 40 % of the one-thread GEMM peak).

The model is the Fashion-MNIST study's (28 px, patch 7, D 96, depth 4, 4 heads, MLP 2x: a linear is
(32·17) × 96 × 288 at batch 32), trained by each method's own `train` for one epoch from its
cached features, one thread, as its per-shard `train` job does (N = 1) and as the vectorized job
of N shards does (`--shards`). Per case three figures, each the median of `--repeats`:

- `step`: the epoch's wall time; with the epoch's model FLOPs (`job.counters.flop_counter`, as
  the jobs' counters count them) its % of the 1024² GEMM peak, the efficiency table's figure.
- `products`: every product that FLOP count covers (mm, addmm, bmm, convolutions, attention
  kernels), recorded with its shapes and strides during one epoch and replayed alone, back to
  back, on fresh tensors. Its % of peak is the ceiling of `step` if every other op were free.
- `other`: step - products: elementwise, norms, softmax, the optimizer, autograd and Python.

    python benchmarks/bench_gemm_shapes.py [--methods fc,nlft-1,taft-1,last,full] [--samples 320] [--profile]

`--profile` also prints each method's ops by self time (`torch.profiler`) over one epoch.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_map  # noqa: E402

from pipeline_src.job.counters import flop_counter  # noqa: E402
from pipeline_src.methods.registry import build_tuned_model, get_method, taft_options  # noqa: E402
from pipeline_src.methods.vectorized import train_shards_vectorized  # noqa: E402
from pipeline_src.store.benchmark_rows import benchmark_row, time_median, write_benchmark_rows  # noqa: E402
from pipeline_src.store.gemm_peak import measure_gemm_peak  # noqa: E402
from pipeline_src.taft.train import train_tangent_vectorized  # noqa: E402

ARCH = dict(img_size=28, patch_size=7, in_chans=1, num_classes=5, embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0)
METHODS = {"fc": {"kind": "fc"}, "nlft-1": {"kind": "nlft", "k": 1}, "taft-1": {"kind": "taft", "k": 1, "kappa": 15},
           "last": {"kind": "last", "rank": 16, "heads": 4, "every": 2, "modules_per_block": 2},
           "full": {"kind": "full"}}
SETTINGS = {"epochs": 1, "batch_size": 32, "lr": 1e-3, "weight_decay": 0.0, "schedule": None}
COUNTED = set(flop_counter().flop_registry)  # the ops the jobs' FLOP counters count (CPU attention included)


class TensorSpec(tuple):
    """(shape, stride, dtype) of a recorded op's tensor argument."""


def tensor_spec(a):
    return TensorSpec((tuple(a.shape), tuple(a.stride()), a.dtype)) if isinstance(a, torch.Tensor) else a


class ProductRecorder(TorchDispatchMode):
    """Records every counted op that runs (its overload and its arguments, tensors as specs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in COUNTED:
            self.calls.append((func, tree_map(tensor_spec, args), tree_map(tensor_spec, kwargs)))
        return func(*args, **kwargs)


def replayable(calls: list[tuple]) -> list[tuple]:
    """The recorded calls with fresh random tensors of the recorded shapes and strides."""
    def fresh(a):
        if isinstance(a, TensorSpec):
            shape, stride, dtype = a
            return torch.empty_strided(shape, stride, dtype=dtype).normal_() if dtype.is_floating_point \
                else torch.empty_strided(shape, stride, dtype=dtype).zero_()
        return a
    return [(f, tree_map(fresh, args), tree_map(fresh, kwargs)) for f, args, kwargs in calls]


def epoch_fn(backbone, name: str, feats: torch.Tensor, labels: torch.Tensor, shards: int):
    """One training epoch of `name` as its `train` job runs it (shards = 1) or as the vectorized job of
    `shards` shard models, each on the same features (`train_vectorized`), under an optional mode."""
    cfg = METHODS[name]
    settings = {**SETTINGS, "method": cfg}

    def epoch(mode=None) -> None:
        model = build_tuned_model(backbone, cfg, 5, seed=0)
        with mode if mode is not None else contextlib.nullcontext():
            if shards == 1:
                get_method(cfg["kind"]).train(model, feats, labels, settings, 0, "bench")
            elif cfg["kind"] == "taft":
                o = taft_options(cfg)
                train_tangent_vectorized(model, [(feats, labels)] * shards, epochs=1, batch_size=SETTINGS["batch_size"],
                                         lr=SETTINGS["lr"], weight_decay_l2=o["l2"], loss=o["loss"], alpha=o["alpha"],
                                         kappa=o["kappa"], radius=o["radius"], seed=list(range(shards)))
            else:
                train_shards_vectorized(model, cfg, [(feats, labels)] * shards, settings, list(range(shards)))
    return epoch


def run(methods: list[str], samples: int, shard_counts: list[int], repeats: int, profile: bool = False) -> list[dict]:
    torch.manual_seed(0)
    backbone = VisionTransformer(**ARCH).eval()
    peak = measure_gemm_peak("cpu", threads=torch.get_num_threads())
    print(f"GEMM peak ({peak.threads} thread(s), {peak.size}²): {peak.flops_per_s / 1e9:.1f} GFLOP/s", flush=True)
    images, labels = torch.randn(samples, 1, 28, 28), torch.randint(0, 5, (samples,))
    rows = []
    for name in methods:
        with torch.no_grad():
            feats = build_tuned_model(backbone, METHODS[name], 5, seed=0).prefix(images)
        for shards in shard_counts:
            if shards > 1 and name == "full":
                continue  # full trains per shard (no vectorized path)
            epoch = epoch_fn(backbone, name, feats, labels, shards)
            counter, recorder = flop_counter(), ProductRecorder()
            epoch(counter)
            epoch(recorder)
            flops = counter.get_total_flops()
            calls = replayable(recorder.calls)

            def products() -> None:
                for f, args, kwargs in calls:
                    f(*args, **kwargs)

            products()  # warm-up (the epoch's: the two counted epochs above)
            step_ms, product_ms = [], []
            for _ in range(repeats):  # interleaved: both see the same machine load
                step_ms += time_median(epoch, repeats=1, warmup=0)[1]
                product_ms += time_median(products, repeats=1, warmup=0)[1]
            step, prod = statistics.median(step_ms), statistics.median(product_ms)
            if profile:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    epoch()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), flush=True)
            shape = {"method": name, "shards": shards, "samples_per_shard": samples,
                     "batch_size": SETTINGS["batch_size"], "arch": ARCH, "threads": torch.get_num_threads(),
                     "model_flops": flops, "products": len(calls),
                     "gemm_peak_gflop_per_s": round(peak.flops_per_s / 1e9, 2)}
            pct = {case: 100 * flops / (statistics.median(t) / 1e3) / peak.flops_per_s
                   for case, t in (("step", step_ms), ("products", product_ms))}
            for case, times in (("step", step_ms), ("products", product_ms)):
                rows.append(benchmark_row("gemm_shapes", case, "cpu", {**shape, "peak_pct": round(pct[case], 2)},
                                          times, None, not_measured="time only"))
            print(f"{name:7s} N {shards:3d}  {flops / samples / shards / 1e6:6.2f} MFLOP/image  step {step:8.1f} ms "
                  f"({pct['step']:4.1f} % of peak)  products alone {prod:8.1f} ms ({pct['products']:4.1f} %)  "
                  f"other {100 * (1 - prod / step):4.1f} % of the step ({len(calls)} products)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--samples", type=int, default=320, help="training samples (batch 32: ten steps)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--shards", default="1,10", help="1: the per-shard `train` job; N > 1: the vectorized job of N")
    ap.add_argument("--profile", action="store_true", help="print each method's ops by self time")
    ap.add_argument("--out", default="results/benchmarks")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = run(args.methods.split(","), args.samples, [int(n) for n in args.shards.split(",")], args.repeats,
               args.profile)
    print(write_benchmark_rows("gemm_shapes", rows, args.out))


if __name__ == "__main__":
    main()
