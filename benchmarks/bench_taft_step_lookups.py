"""TAFT's training step with its parameter lookups at every step (before 2026-12-07) against once
per training run (`tangent_step(..., params=, pairs=)`, what `train_tangent` does now).

`model.delta_parameters()` and `model.base_delta_parameters()` walk the module tree: cheap for
ViT-B/16's compute, not for the default study's small ViT, whose steps are mostly Python. The
default study's ViT, TAFT-1 and TAFT-4 from cached prefix features, λ = 1e-5 (the taft default), one
thread, epochs of 527 images in batches of 32; the two ways interleaved epoch by epoch in one
process, so the machine's drifting speed reaches both alike. Rows go to
<out-dir>/taft_step_lookups.parquet (`store/benchmark_rows.py`), CPU ms per epoch.

    python benchmarks/bench_taft_step_lookups.py --epochs 8
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

L2 = 1e-5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=8, help="timed epochs per (k, way)")
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()

    import torch
    from default_study_model import default_vit_and_data

    from pipeline_src.optim.adamw import adamw
    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows
    from pipeline_src.taft import TangentViT
    from pipeline_src.taft.losses import get_loss
    from pipeline_src.taft.train import tangent_step

    torch.set_num_threads(1)
    vit, x, y = default_vit_and_data()  # config.yaml's backbone.arch
    rsl = get_loss("rsl", None, None)
    rows = []
    for k in (1, 4):
        ways = {}
        for way in ("every-step", "once-per-run"):
            model = TangentViT(copy.deepcopy(vit), k).eval()
            with torch.no_grad():
                h = model.prefix(x)
            params, pairs = model.delta_parameters(), model.base_delta_parameters()
            opt = adamw(params, lr=1e-3, weight_decay=0.0)
            looked_up = {} if way == "every-step" else {"params": params, "pairs": pairs}
            ways[way] = (model, opt, h, looked_up)
        times: dict[str, list[float]] = {way: [] for way in ways}
        for epoch in range(args.epochs + 1):  # the first epoch warms up
            for way, (model, opt, h, looked_up) in ways.items():
                order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
                t = time.process_time()
                for start in range(0, len(y), 32):
                    idx = order[start:start + 32]
                    tangent_step(model, opt, h[idx], y[idx], rsl, L2, **looked_up)
                if epoch:
                    times[way].append((time.process_time() - t) * 1000)
        for way, ms in times.items():
            print(f"taft-{k} {way:13s} CPU per epoch: median {statistics.median(ms):7.1f} ms, min {min(ms):7.1f} ms")
            rows.append(benchmark_row("taft_step_lookups", f"taft-{k}/{way}", "cpu",
                                      {"images": len(y), "batch": 32, "threads": 1, "dtype": "float32", "l2": L2},
                                      ms, None, not_measured="the two ways share one process"))
        print(f"taft-{k} once-per-run / every-step: "
              f"{statistics.median(times['once-per-run']) / statistics.median(times['every-step']):.3f}")
    print(write_benchmark_rows("taft_step_lookups", rows, args.out_dir))


if __name__ == "__main__":
    main()
