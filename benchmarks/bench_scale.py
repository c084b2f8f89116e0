"""Benchmark: does a real-size study's memory stay flat as the dataset grows? (issue 12)

A synthetic ImageFolder of random 224 px JPEGs (10 classes) per size, `vit_tiny_patch16_224`
with `pretrained: false`, methods taft-1, last and nlft-1, N = 10 shards, one epoch, on the
CPU with the fork server off (each job is its own process, so its peak RSS is its own). The
whole study up to `evaluate_all` runs through the real Snakefile.

Per job type (rule), the rows record the largest peak RSS of its jobs (`ru_maxrss`, which
every step's log ends with: `pipeline_src/runner/execute.py`) and their wall times; one
`study` row per size holds the study's wall time and, in `sizes`, the disk used by
`results/`, its feature caches and its images. Goal: for every job type but `prepare`'s
fixed buffers, peak RSS at the largest size ≤ 1.2× that at the smallest.

Evaluation runs `train.eval_batch_size` = 64 images at a time (EVAL_BATCH): the test split
(30 %: 150 images at 500) fills such batches at every size, so `evaluate` compares one full
batch with one full batch. At the default 256 its peak grows with the split until the split
fills a batch (taft-1 ViT-Ti: 1.51 GB at 150 test images, 1.95 GB at 600), which is the batch
size, not the dataset.

    python benchmarks/bench_scale.py                      # 500 and 2,000 images
    python benchmarks/bench_scale.py --sizes 8000 --cores 8
    python benchmarks/bench_scale.py --sizes 100 --work /tmp/scale_smoke    # a quick check

Needs a quiet machine: timings and RSS of a loaded one are not comparable.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows  # noqa: E402

EVAL_BATCH = 64  # images per evaluation batch: full at every size benchmarked (see the docstring)
PEAK = re.compile(r"^\[launch\] peak RSS ([\d.]+) MB, wall ([\d.]+) s(?:, cpu [\d.]+ s)?$", re.M)


def make_image_folder(root: Path, n: int, size: int = 224, classes: int = 10, seed: int = 0) -> None:
    """n random RGB JPEGs, class by class (a colour tint per class, so the task is learnable)."""
    from PIL import Image

    if (root / ".complete").exists() and int((root / ".complete").read_text()) == n:
        return
    rng = np.random.default_rng(seed)
    for i in range(n):
        c = i % classes
        d = root / f"class{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        img = rng.integers(0, 200, (size, size, 3), dtype=np.uint8)
        img[..., c % 3] += np.uint8(55)
        Image.fromarray(img).save(d / f"img{i:06d}.jpg", quality=85)
    (root / ".complete").write_text(str(n))


def study_config(root: Path, shards: int, every: int) -> dict:
    return {
        "experiment": "bench-scale", "device": "cpu",
        "dataset": {"source": "imagefolder", "path": str(root), "img_size": 224, "in_chans": 3},
        "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224", "pretrained": False},
        "methods": {"taft-1": {"kind": "taft", "k": 1}, "nlft-1": {"kind": "nlft", "k": 1},
                    "last": {"kind": "last", "rank": 16, "heads": 4, "every": every}},
        "train": {"epochs": 1, "batch_size": 32, "eval_batch_size": EVAL_BATCH}, "shards": [shards], "seeds": [0],
    }


def disk_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20 if path.exists() else 0.0


def job_peaks(results: Path) -> dict[str, list[tuple[float, float]]]:
    """Rule (log folder) -> [(peak RSS MB, wall s)] of its jobs."""
    out: dict[str, list[tuple[float, float]]] = {}
    for log in sorted((results / "logs").rglob("*.log")):
        m = PEAK.search(log.read_text(errors="replace"))
        if m:
            out.setdefault(log.relative_to(results / "logs").parts[0], []).append((float(m[1]), float(m[2])))
    return out


def run_size(n: int, args) -> list[dict]:
    work = Path(args.work) / f"n{n}"
    make_image_folder(work / "data", n)
    study = work / "study"
    if study.exists():  # a study left by an earlier run would rerun only the jobs whose code changed
        shutil.rmtree(study)
    study.mkdir(parents=True)
    (study / "config.yaml").write_text(yaml.safe_dump(study_config(work / "data", args.shards, args.every)))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
                           str(study), "--cores", str(args.cores), "evaluate_all"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_FORKSERVER": "0"})
    wall = time.perf_counter() - t0
    (work / "snakemake.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"study of {n} images failed; see {work / 'snakemake.log'}")
    results = study / "results"
    disk = {"results_mb": disk_mb(results), "features_mb": disk_mb(results / "features"),
            "prepare_mb": disk_mb(results / "prepare")}
    sizes = {"images": n, "img_size": 224, "shards": args.shards, "every": args.every, "cores": args.cores}
    rows = []
    for rule, jobs in sorted(job_peaks(results).items()):
        peak = max(p for p, _ in jobs)
        rows.append(benchmark_row("bench_scale", rule, "cpu", {**sizes, "jobs": len(jobs)},
                                  [w * 1e3 for _, w in jobs], peak))
        print(f"{n:>6} images  {rule:<24} {len(jobs):>3} jobs  peak RSS {peak:7.0f} MB  "
              f"median wall {statistics.median(w for _, w in jobs):6.1f} s", flush=True)
    rows.append(benchmark_row("bench_scale", "study", "cpu", {**sizes, **disk}, [wall * 1e3],
                              max((r["peak_mem_mb"] for r in rows), default=0.0)))
    print(f"{n:>6} images  study: {wall:.0f} s, results/ {disk['results_mb']:.0f} MB "
          f"(features {disk['features_mb']:.0f} MB, prepare {disk['prepare_mb']:.0f} MB)", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="500,2000", help="comma-separated image counts")
    p.add_argument("--shards", type=int, default=10)
    p.add_argument("--every", type=int, default=1, help="LAST side-block spacing g (the blocks cache keeps 12/g + 1)")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--work", default="/tmp/bench_scale", help="datasets and studies go here")
    p.add_argument("--out-dir", default=str(REPO / "results" / "benchmarks"))
    args = p.parse_args()
    rows = [r for n in (int(s) for s in args.sizes.split(",")) for r in run_size(n, args)]
    path = write_benchmark_rows("bench_scale", rows, args.out_dir)
    print(f"wrote {len(rows)} rows to {path}")
    sizes = sorted({json.loads(r["sizes"])["images"] for r in rows})
    if len(sizes) > 1:
        peak = {(json.loads(r["sizes"])["images"], r["case"]): r["peak_mem_mb"] for r in rows if r["case"] != "study"}
        for case in sorted({c for _, c in peak}):
            if (sizes[0], case) in peak and (sizes[-1], case) in peak:
                print(f"{case:<24} peak RSS {sizes[-1]} / {sizes[0]} images: {peak[sizes[-1], case] / peak[sizes[0], case]:.2f}x")


if __name__ == "__main__":
    main()
