"""TAFT's training step with its parameter lookups at every step (before 2026-12-07) against once
per training run (`tangent_step(..., params=, pairs=)`, what `train_tangent` does now).

`model.delta_parameters()` and `model.base_delta_parameters()` walk the module tree: cheap for
ViT-B/16's compute, not for the default study's small ViT, whose steps are mostly Python. The
default study's ViT, TAFT-1 and TAFT-4 from cached prefix features, λ = 1e-5 (the taft default), one
thread, epochs of 527 images in batches of 32; the two ways interleaved epoch by epoch in one
process, so the machine's drifting speed reaches both alike. Rows go to
<out-dir>/taft_step_lookups.parquet (`store/benchmark_rows.py`), CPU ms per epoch; and the two lookups
timed alone (ms per step), the firmer figure where the epochs' medians move by a few per cent.

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
    from default_study_model import default_vit_and_data, interleaved_epoch_ms

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
        steps, models = {}, {}
        for way in ("every-step", "once-per-run"):
            model = TangentViT(copy.deepcopy(vit), k).eval()
            with torch.no_grad():
                h = model.prefix(x)
            params, pairs = model.delta_parameters(), model.base_delta_parameters()
            opt = adamw(params, lr=1e-3, weight_decay=0.0)
            looked_up = {} if way == "every-step" else {"params": params, "pairs": pairs}
            models[way] = model
            steps[way] = (lambda idx, m=model, o=opt, h=h, kw=looked_up: tangent_step(m, o, h[idx], y[idx], rsl, L2, **kw))
        times = interleaved_epoch_ms(steps, len(y), args.epochs)
        model = models["every-step"]
        t, calls = time.process_time(), 500
        for _ in range(calls):  # what every-step adds to each step: both lookups
            model.delta_parameters(), model.base_delta_parameters()
        lookup_ms = (time.process_time() - t) / calls * 1000
        print(f"taft-{k} both lookups: {lookup_ms * 1000:.0f} us a step, "
              f"{100 * lookup_ms * -(-len(y) // 32) / statistics.median(times['every-step']):.1f} % of an epoch")
        rows.append(benchmark_row("taft_step_lookups", f"taft-{k}/lookups", "cpu", {"calls": calls, "threads": 1},
                                  [lookup_ms], None, not_measured="a lookup allocates a list of references"))
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
