"""A DP-SGD job's loop with the heap trimmed after every batch (at most every 50 ms, before
2026-12-07) against trimmed only once its RSS has grown (`job/glibc_malloc.release_freed`'s slack,
now): user and system CPU, page faults and peak RSS.

Each repeat runs the loop in a fresh child process with a job's allocator settings
(`runner/execute.job_allocator`, the DP step's `MMAP_THRESHOLD`), one thread: the default study's
ViT with its blocks, norm and head trained (the full regime's parameters) by `dp.train_private` (book-keeping clipping,
ε 8) on 527 random images in Poisson batches of 64. The child reads its own `getrusage` around the
training only. The two ways alternate repeat by repeat, so the machine's drifting speed reaches
both alike. Rows go to <out-dir>/heap_trim.parquet (`store/benchmark_rows.py`): CPU ms (user +
system) in `time_ms_*`, the system ms, faults and peaks in `sizes`.

    python benchmarks/bench_heap_trim.py --repeats 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

WAYS = {"every-batch": 0, "on-growth": None}  # release_freed's slack: 0 trims at every call; None: the default


def child(way: str, epochs: int) -> dict:
    """Train once in this process the `way` says; returns its CPU, faults and peak RSS."""
    import resource

    import torch
    from default_study_model import default_vit_and_data

    from pipeline_src.dp import train_private
    from pipeline_src.job import glibc_malloc
    from pipeline_src.runner.execute import job_allocator
    from pipeline_src.steps.privacy import train as dp_step

    torch.set_num_threads(1)
    job_allocator()
    job_allocator(dp_step.MMAP_THRESHOLD)  # as `execute` pins a step's own threshold
    if WAYS[way] is not None:
        glibc_malloc.release_freed.__defaults__ = (glibc_malloc.TRIM_INTERVAL_S, WAYS[way])
    vit, x, y = default_vit_and_data()
    for name, param in vit.named_parameters():  # the blocks, norm and head train, as the DP full regime's tuned part
        param.requires_grad_(name.startswith(("blocks.", "norm.", "head.")))
    before = resource.getrusage(resource.RUSAGE_SELF)
    train_private(vit, x, y, epochs=epochs, batch_size=64, lr=0.01, epsilon=8.0, delta=1e-5, max_grad_norm=1.0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"user_ms": 1000 * (after.ru_utime - before.ru_utime), "system_ms": 1000 * (after.ru_stime - before.ru_stime),
            "faults": after.ru_minflt - before.ru_minflt, "peak_rss_mb": after.ru_maxrss / 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="children per way")
    p.add_argument("--epochs", type=int, default=5, help="DP-SGD epochs per child")
    p.add_argument("--out-dir", default="results/benchmarks")
    p.add_argument("--child", choices=sorted(WAYS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.epochs)))
        return

    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows

    got: dict[str, list[dict]] = {way: [] for way in WAYS}
    for _ in range(args.repeats):
        for way in WAYS:
            out = subprocess.run([sys.executable, __file__, "--child", way, "--epochs", str(args.epochs)],
                                 capture_output=True, text=True, check=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
            got[way].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for way, runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{way:12s} CPU {med['user_ms'] + med['system_ms']:7.0f} ms (system {med['system_ms']:5.0f}), "
              f"{med['faults']:8.0f} page faults, peak RSS {med['peak_rss_mb']:.0f} MB (medians of {len(runs)})")
        rows.append(benchmark_row("heap_trim", way, "cpu",
                                  {"images": 527, "batch": 64, "epochs": args.epochs, "threads": 1, "dtype": "float32",
                                   "trained": "blocks, norm, head", "system_ms": [r["system_ms"] for r in runs],
                                   "faults": [r["faults"] for r in runs]},
                                  [r["user_ms"] + r["system_ms"] for r in runs], med["peak_rss_mb"],
                                  method="ru_maxrss of the child (its whole life)"))
    print(write_benchmark_rows("heap_trim", rows, args.out_dir))


if __name__ == "__main__":
    main()
