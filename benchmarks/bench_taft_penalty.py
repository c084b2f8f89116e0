"""TAFT's L2 penalty on Δw in a training step: in the loss through autograd (before 2026-11-29)
against its gradient added directly (`taft.losses.add_l2_penalty_gradient_`, what `tangent_step`
does now).

The default study's ViT, TAFT-1 and TAFT-4 from cached prefix features, λ = 1e-5 (the taft
default), one thread, epochs of 527 images in batches of 32; the two ways interleaved epoch by
epoch in one process, so the machine's drifting speed reaches both alike. Rows go to
<out-dir>/taft_penalty.parquet (`store/benchmark_rows.py`), CPU ms per epoch.

    python benchmarks/bench_taft_penalty.py --epochs 8
"""
from __future__ import annotations

import argparse
import copy
import sys
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
    from pipeline_src.taft.losses import delta_l2_penalty, get_loss
    from pipeline_src.taft.primal_gradient import primal_gradient_backward
    from pipeline_src.taft.train import tangent_step

    torch.set_num_threads(1)
    vit, x, y = default_vit_and_data()  # config.yaml's backbone.arch
    rsl = get_loss("rsl", None, None)

    def in_the_loss(model, opt, h, labels):
        opt.zero_grad(set_to_none=True)
        primal_gradient_backward(model, lambda: rsl(model.forward_from_prefix(h), labels) + L2 * delta_l2_penalty(model))
        opt.step()

    rows = []
    for k in (1, 4):
        steps = {}
        for way in ("in-the-loss", "gradient-added"):
            model = TangentViT(copy.deepcopy(vit), k).eval()
            with torch.no_grad():
                h = model.prefix(x)
            opt = adamw(model.delta_parameters(), lr=1e-3, weight_decay=0.0)
            step = in_the_loss if way == "in-the-loss" else (lambda m, o, f, lab: tangent_step(m, o, f, lab, rsl, L2))
            steps[way] = (lambda idx, step=step, m=model, o=opt, h=h: step(m, o, h[idx], y[idx]))
        times = interleaved_epoch_ms(steps, len(y), args.epochs)
        for way, ms in times.items():
            print(f"taft-{k} {way:15s} CPU per epoch: median {sorted(ms)[len(ms) // 2]:7.1f} ms, min {min(ms):7.1f} ms")
            rows.append(benchmark_row("taft_penalty", f"taft-{k}/{way}", "cpu",
                                      {"images": len(y), "batch": 32, "threads": 1, "dtype": "float32", "l2": L2},
                                      ms, None, not_measured="the two ways share one process"))
    print(write_benchmark_rows("taft_penalty", rows, args.out_dir))


if __name__ == "__main__":
    main()
