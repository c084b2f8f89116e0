"""What counting a job's first batch costs: the batch plain, under torch's `FlopCounterMode` (the
jobs' counter before 2026-11-29) and under the jobs' counter (`job/counters.flop_counter`).

Three batches of the default study (its ViT, batch 32, one thread): a full fine-tuning train step,
a TAFT-1 step from cached prefix features, and an evaluation forward. The three ways are
interleaved, repeat by repeat, so the machine's drifting speed reaches all alike. Every job counts
its first train batch and the first batch of each evaluation phase once, so "counted − plain" is
what a job pays. Rows go to <out-dir>/flop_counter.parquet (`store/benchmark_rows.py`), CPU ms
per batch, one row per (batch, way).

    python benchmarks/bench_flop_counter.py --repeats 30
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=30, help="timed batches per (batch, way)")
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()

    import contextlib

    import torch
    import torch.nn.functional as F
    from default_study_model import default_vit_and_data
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline_src.job.counters import flop_counter
    from pipeline_src.optim.adamw import adamw
    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows
    from pipeline_src.taft import TangentViT
    from pipeline_src.taft.losses import get_loss
    from pipeline_src.taft.train import tangent_step

    torch.set_num_threads(1)
    vit, x, y = default_vit_and_data(32)  # config.yaml's backbone.arch
    opt = adamw(list(vit.parameters()), lr=1e-3, weight_decay=0.0)

    def full_step():
        loss = F.cross_entropy(vit.train()(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    taft = TangentViT(vit, 1).eval()
    with torch.no_grad():
        h = taft.prefix(x)
    taft_opt = adamw(taft.delta_parameters(), lr=1e-3, weight_decay=0.0)
    rsl = get_loss("rsl", None, None)

    @torch.no_grad()
    def eval_forward():
        vit.eval()(x)

    batches = {"full-train": full_step, "taft-1-train": lambda: tangent_step(taft, taft_opt, h, y, rsl),
               "eval": eval_forward}
    ways = {"plain": contextlib.nullcontext, "torch": lambda: FlopCounterMode(display=False),
            "jobs": flop_counter}
    rows = []
    for name, batch in batches.items():
        times: dict[str, list[float]] = {way: [] for way in ways}
        for r in range(args.repeats + 2):  # the first two warm up
            for way, ctx in ways.items():
                t = time.process_time()
                with ctx():
                    batch()
                if r >= 2:
                    times[way].append((time.process_time() - t) * 1000)
        medians = {way: sorted(ms)[len(ms) // 2] for way, ms in times.items()}
        print(f"{name:13s} CPU ms per batch, median: plain {medians['plain']:6.1f}, torch's counter "
              f"{medians['torch']:6.1f} (+{medians['torch'] - medians['plain']:5.1f}), the jobs' counter "
              f"{medians['jobs']:6.1f} (+{medians['jobs'] - medians['plain']:5.1f})")
        for way, ms in times.items():
            rows.append(benchmark_row("flop_counter", f"{name}/{way}", "cpu",
                                      {"batch": 32, "threads": 1, "dtype": "float32"}, ms, None,
                                      not_measured="the three ways share one process"))
    print(write_benchmark_rows("flop_counter", rows, args.out_dir))


if __name__ == "__main__":
    main()
