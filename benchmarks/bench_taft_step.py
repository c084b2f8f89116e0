"""Two ways of TAFT's training step, interleaved epoch by epoch (issue 44): what `tangent_step` did
before against what it does now.

- `penalty`: the L2 penalty on Δw in the loss through autograd (before 2026-11-29) against its
  gradient added directly (`taft.losses.add_l2_penalty_gradient_`). Rows: <out-dir>/taft_penalty.parquet.
- `lookups`: `model.delta_parameters()` and `model.base_delta_parameters()` at every step (before
  2026-12-07) against once per training run (`tangent_step(..., params=, pairs=)`, what
  `train_tangent` does now). The two module walks are also timed alone (ms per step): the firmer
  figure where the epochs' medians move by a few per cent. Rows: <out-dir>/taft_step_lookups.parquet.

The default study's ViT, TAFT-1 and TAFT-4 from cached prefix features, λ = 1e-5 (the taft
default), one thread, epochs of 527 images in batches of 32; the two ways of a comparison share one
process, so the machine's drifting speed reaches both alike. CPU ms per epoch
(`store/benchmark_rows.py`).

    python benchmarks/bench_taft_step.py --epochs 8                 # both comparisons
    python benchmarks/bench_taft_step.py --compare lookups --epochs 6
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
BATCH = 32
WAYS = {"penalty": ("in-the-loss", "gradient-added"), "lookups": ("every-step", "once-per-run")}
BENCHMARK = {"penalty": "taft_penalty", "lookups": "taft_step_lookups"}


def step_of(way: str, model, opt, labels, loss_fn):
    """`step(h, idx)`: one optimizer step of `model` on the cached features `h[idx]`, done `way`."""
    from pipeline_src.taft.losses import delta_l2_penalty
    from pipeline_src.taft.primal_gradient import primal_gradient_backward
    from pipeline_src.taft.train import tangent_step

    if way == "in-the-loss":
        def step(h, idx):
            opt.zero_grad(set_to_none=True)
            primal_gradient_backward(model, lambda: loss_fn(model.forward_from_prefix(h[idx]), labels[idx])
                                     + L2 * delta_l2_penalty(model))
            opt.step()
        return step
    looked_up = {"params": model.delta_parameters(), "pairs": model.base_delta_parameters()} if way == "once-per-run" else {}
    return lambda h, idx: tangent_step(model, opt, h[idx], labels[idx], loss_fn, L2, **looked_up)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", nargs="+", choices=sorted(WAYS), default=sorted(WAYS), help="which comparisons")
    p.add_argument("--epochs", type=int, default=8, help="timed epochs per (k, way)")
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()

    import torch
    from default_study_model import default_vit_and_data, interleaved_epoch_ms

    from pipeline_src.optim.adamw import adamw
    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows
    from pipeline_src.taft import TangentViT
    from pipeline_src.taft.losses import get_loss

    torch.set_num_threads(1)
    vit, x, y = default_vit_and_data()  # config.yaml's backbone.arch
    rsl = get_loss("rsl", None, None)
    sizes = {"images": len(y), "batch": BATCH, "threads": 1, "dtype": "float32", "l2": L2}
    for compare in args.compare:
        rows = []
        for k in (1, 4):
            steps, models = {}, {}
            for way in WAYS[compare]:
                model = models[way] = TangentViT(copy.deepcopy(vit), k).eval()
                with torch.no_grad():
                    h = model.prefix(x)
                step = step_of(way, model, adamw(model.delta_parameters(), lr=1e-3, weight_decay=0.0), y, rsl)
                steps[way] = (lambda idx, step=step, h=h: step(h, idx))
            times = interleaved_epoch_ms(steps, len(y), args.epochs, BATCH)
            if compare == "lookups":
                model, t, calls = models["every-step"], time.process_time(), 500
                for _ in range(calls):  # what every-step adds to each step: both lookups
                    model.delta_parameters(), model.base_delta_parameters()
                lookup_ms = (time.process_time() - t) / calls * 1000
                print(f"taft-{k} both lookups: {lookup_ms * 1000:.0f} us a step, "
                      f"{100 * lookup_ms * -(-len(y) // BATCH) / statistics.median(times['every-step']):.1f} % of an epoch")
                rows.append(benchmark_row(BENCHMARK[compare], f"taft-{k}/lookups", "cpu", {"calls": calls, "threads": 1},
                                          [lookup_ms], None, not_measured="a lookup allocates a list of references"))
            for way, ms in times.items():
                print(f"taft-{k} {way:15s} CPU per epoch: median {statistics.median(ms):7.1f} ms, min {min(ms):7.1f} ms")
                rows.append(benchmark_row(BENCHMARK[compare], f"taft-{k}/{way}", "cpu", sizes, ms, None,
                                          not_measured="the two ways share one process"))
            old, new = WAYS[compare]
            print(f"taft-{k} {new} / {old}: {statistics.median(times[new]) / statistics.median(times[old]):.3f}")
        print(write_benchmark_rows(BENCHMARK[compare], rows, args.out_dir))


if __name__ == "__main__":
    main()
