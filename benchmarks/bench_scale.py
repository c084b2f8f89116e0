"""Benchmark: does every job's memory stay flat as the dataset grows? (issues 12, 23 and 25)

Each size runs a whole study through the real Snakefile (target `all`: every enabled study and the
report), on the CPU, with the fork server off: each job is a process of its own, reaped by its
client with `os.wait4`, whose `ru_maxrss` is the job's exact peak RSS to its exit, interpreter
shutdown included (`<job>.rss.json`, `pipeline_src/store/job_rss.py`; the job's own
`[launch] peak RSS` line misses the shutdown). Per rule, the rows record the largest peak of its
jobs and their wall times; one `study` row per size holds the study's wall time and, in `sizes`,
the disk used by `results/`. A `baseline` row holds the peak of a process that only imports what
a job imports (numpy, torch, timm, ...), measured the same way.

Two modes:

- synthetic (issue 25): an ImageFolder of random 224 px JPEGs (10 classes; 60/10/30 %
  train/val/test), `vit_tiny_patch16_224` with `pretrained: false`, methods taft-1, nlft-1 and
  last at N = `--shards`, one epoch, plus (`--studies`) the privacy study (DP-SGD of nlft-1 and
  taft-1 at ε = 8 on one shard of the whole training split, ours and the paper's full-batch
  protocol) and the fusion study (nlft-1 and last at N shards, shared and random inits, no matching
  and rotation-scaling, soup, Fisher, RegMean). Goal: every rule's peak grows by ≤ 128 MB from
  1,000 to 16,000 images.
- fashion (issue 23): `studies/fashion_mnist.yaml` (Debian's Fashion-MNIST) at `--limits`
  (`dataset.limit_per_class` and `source_limit_per_class`; 233: 6,990 images, `none`: all 70,000),
  restricted to stay feasible on a small machine: methods fc, nlft-1, taft-1, last; shards 1 and
  10; `--epochs` training epochs and one pretraining epoch (a job's peak depends on its batches
  and its data, not on how many passes it makes); a small privacy section (taft-1 and nlft-1, head
  only, ε = 8, N = 1, ours and the paper's protocol) and fusion section (nlft-1 and last at N = 10,
  shared init, none and rotation-scaling); no unlearning study. Goal: every rule's peak at 70,000
  images ≤ 1.2× its peak at the subset.

    python benchmarks/bench_scale.py                       # synthetic: 1,000 and 16,000 images
    python benchmarks/bench_scale.py --mode fashion        # Fashion-MNIST: 6,990 and 70,000 images
    python benchmarks/bench_scale.py --sizes 100,200 --img-size 32 --shards 2 --work /tmp/scale_smoke  # a quick check

Needs a quiet machine for its wall times; the peaks are exact either way.
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

from pipeline_src.reports.efficiency import rule_of_log  # noqa: E402
from pipeline_src.runner.forkserver import PRELOAD  # noqa: E402
from pipeline_src.runner.stop_run import start_snakemake, stop_snakemake  # noqa: E402
from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows  # noqa: E402
from pipeline_src.store.job_rss import RSS_SUFFIX, maxrss_kib, read_job_rss  # noqa: E402

EVAL_BATCH = 64  # images per evaluation batch: full at every size benchmarked (issue 12)
GROWTH_MB = 128.0  # issue 25: a rule's peak grows by at most this from the smallest to the largest size
RATIO = 1.2  # issue 23: a rule's peak at the largest size at most this times its peak at the smallest
WALL = re.compile(r"^\[launch\] peak RSS [\d.]+ MB, wall ([\d.]+) s", re.M)  # a job's own line (rules without a benchmark file)
PEAK_METHOD = "max over the rule's jobs of os.wait4 ru_maxrss (each job its own process, shutdown included)"


def make_image_folder(root: Path, n: int, size: int = 224, classes: int = 10, seed: int = 0) -> None:
    """n random RGB JPEGs, class by class (a colour tint per class, so the task is learnable)."""
    from PIL import Image

    if (root / ".complete").exists() and (root / ".complete").read_text() == f"{n} {size}":
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        c = i % classes
        d = root / f"class{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        img = rng.integers(0, 200, (size, size, 3), dtype=np.uint8)
        img[..., c % 3] += np.uint8(55)
        Image.fromarray(img).save(d / f"img{i:06d}.jpg", quality=85)
    (root / ".complete").write_text(f"{n} {size}")


def counts(cfg: dict) -> tuple[int, int]:
    """(images in the study, target training images) of a config, without decoding an image."""
    from pipeline_src.plan.config import validate_config
    from pipeline_src.plan.samples import assign_splits, list_samples

    cfg = validate_config({**cfg, "privacy": {"enabled": False}, "fusion": {"enabled": False},
                           "forget": {"study": {"enabled": False}}}, count_samples=False)
    table = assign_splits(list_samples(cfg["dataset"]), cfg["dataset"], cfg["seed"])
    task, split = table.column("task").to_pylist(), table.column("split").to_pylist()
    return table.num_rows, sum(t == "target" and s == "train" for t, s in zip(task, split))


def with_privacy_and_fusion(cfg: dict, studies: set[str], n_train: int, privacy: dict, fusion: dict) -> dict:
    """The config with the privacy and fusion sections asked for; no unlearning study or LAST grid."""
    cfg = {**cfg, "forget": {"study": {"enabled": False}}, "last_grid": {"enabled": False}}
    cfg["privacy"] = ({"enabled": True, "public_train_size": n_train, "batch_size": min(64, n_train), **privacy}
                      if "privacy" in studies else {"enabled": False})  # (a smoke run's shard holds < 64 images)
    cfg["fusion"] = {"enabled": True, **fusion} if "fusion" in studies else {"enabled": False}
    return cfg


def synthetic_config(root: Path, args) -> dict:
    """Issue 25's study on the ImageFolder at `root`."""
    cfg = {
        "experiment": "bench-scale", "device": "cpu", "seed": 0,
        "dataset": {"source": "imagefolder", "path": str(root), "img_size": args.img_size, "in_chans": 3},
        "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224", "pretrained": False},
        "methods": {"taft-1": {"kind": "taft", "k": 1}, "nlft-1": {"kind": "nlft", "k": 1},
                    "last": {"kind": "last", "rank": 16, "heads": 4, "every": args.every}},
        "train": {"epochs": args.epochs, "batch_size": 32, "eval_batch_size": EVAL_BATCH}, "shards": args.shards,
        "seeds": [0],
    }
    _, n_train = counts(cfg)
    return with_privacy_and_fusion(
        cfg, args.studies, n_train,
        privacy={"methods": ["nlft-1", "taft-1"], "regimes": ["full"], "epsilons": [8], "shards": [1], "epochs": 1,
                 "paper": {"methods": ["taft-1"], "regimes": ["fc"], "epochs": 2}},
        fusion={"methods": ["nlft-1", "last"], "shards": [max(args.shards)], "inits": ["shared", "random_reinit"],
                "matching": ["none", "rotation-scaling"]})


def fashion_config(limit: int | None, args) -> dict:
    """Issue 23's study (`studies/fashion_mnist.yaml`) at `limit` per class and split, restricted (docstring)."""
    cfg = yaml.safe_load((REPO / "studies" / "fashion_mnist.yaml").read_text())
    # every split at `limit`, the test split too (the study file tests on every image: issue 42)
    cfg["dataset"].update(limit_per_class=limit, test_limit_per_class="same", source_limit_per_class=limit)
    cfg["methods"] = {k: cfg["methods"][k] for k in ("fc", "nlft-1", "taft-1", "last")}
    cfg["shards"] = [1, 10]
    cfg["train"].update(epochs=args.epochs, eval_batch_size=256)
    milestones = [m for m in cfg["train"]["schedule"].get("milestones", []) if m < args.epochs]
    cfg["train"]["schedule"] = ({**cfg["train"]["schedule"], "milestones": milestones} if milestones
                                else {"name": "constant"})  # the study's lr steps come after these epochs
    cfg["backbone"]["pretrain"]["epochs"] = 1
    cfg["backbone"]["pretrain"]["schedule"] = {**cfg["backbone"]["pretrain"].get("schedule", {}), "warmup_epochs": 0}
    _, n_train = counts(cfg)
    return with_privacy_and_fusion(
        cfg, args.studies, n_train,
        privacy={"methods": ["nlft-1", "taft-1"], "regimes": ["fc"], "epsilons": [8], "shards": [1], "epochs": 1,
                 "paper": {"methods": ["taft-1"], "regimes": ["fc"], "epochs": 2}},
        fusion={"methods": ["nlft-1", "last"], "shards": [10], "inits": ["shared"],
                "matching": ["none", "rotation-scaling"]})


def disk_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20 if path.exists() else 0.0


def job_peaks(results: Path) -> dict[str, list[tuple[float, float]]]:
    """Rule -> [(peak RSS MB, wall s)] of its jobs, from their `.rss.json` and benchmark files (or,
    for a rule without one, the step's wall time from its log)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for f in sorted((results / "logs").rglob(f"*{RSS_SUFFIX}")):
        stem = f.name.removesuffix(RSS_SUFFIX)
        bench, log = f.with_name(stem + ".bench.tsv"), f.with_name(stem + ".log")
        if bench.exists():
            wall = float(bench.read_text().splitlines()[1].split("\t")[0])
        else:
            m = WALL.findall(log.read_text(errors="replace")) if log.exists() else []
            wall = float(m[-1]) if m else float("nan")
        out.setdefault(rule_of_log(str(bench)), []).append((read_job_rss(f)["peak_rss_mb"], wall))
    return out


def import_baseline() -> tuple[float, float]:
    """(peak RSS MB, wall s) of a process that imports what a job imports (the fork server's PRELOAD), via os.wait4."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "; ".join(f"import {m}" for m in PRELOAD)],
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit("importing the job's libraries failed")
    return maxrss_kib(usage.ru_maxrss) / 1024, time.perf_counter() - t0


def run_size(label: str, cfg: dict, images: int, sizes: dict, args) -> list[dict]:
    """Run the study `cfg` in `<work>/<label>/study` from scratch; its rows."""
    study = Path(args.work) / label / "study"
    if study.exists():  # a study left by an earlier run would rerun only the jobs whose code changed
        shutil.rmtree(study)
    study.mkdir(parents=True)
    (study / "config.yaml").write_text(yaml.safe_dump(cfg))
    t0 = time.perf_counter()
    with open(study.parent / "snakemake.log", "w") as log:
        proc = start_snakemake([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
                                str(study), "--cores", str(args.cores), *args.targets], stdout=log,
                               stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_FORKSERVER": "0"})
        try:
            proc.wait()
        except BaseException:  # Ctrl-C of this script: its jobs end now too (docs/reliability.md)
            stop_snakemake(proc)
            raise
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"study {label} failed; see {study.parent / 'snakemake.log'}")
    results = study / "results" / cfg["experiment"]  # the study's folder (pipeline_src/plan/studies.py)
    sizes = {**sizes, "images": images, "cores": args.cores, "studies": sorted(args.studies)}
    rows = []
    for rule, jobs in sorted(job_peaks(results).items()):
        peak = max(p for p, _ in jobs)
        rows.append(benchmark_row("bench_scale", rule, "cpu", {**sizes, "jobs": len(jobs)},
                                  [w * 1e3 for _, w in jobs], peak, method=PEAK_METHOD))
        print(f"{images:>6} images  {rule:<24} {len(jobs):>3} jobs  peak RSS {peak:7.0f} MB  "
              f"median wall {statistics.median(w for _, w in jobs):6.1f} s", flush=True)
    disk = {"results_mb": disk_mb(results), "features_mb": disk_mb(results / "features")}
    rows.append(benchmark_row("bench_scale", "study", "cpu", {**sizes, **disk}, [wall * 1e3],
                              max((r["peak_mem_mb"] for r in rows), default=None),
                              method=PEAK_METHOD, not_measured=None if rows else "no job wrote a peak"))
    print(f"{images:>6} images  study: {wall:.0f} s, results/ {disk['results_mb']:.0f} MB", flush=True)
    return rows


def summary(rows: list[dict], baseline_mb: float, mode: str) -> str:
    """A Markdown table per rule: peak at the smallest and largest size, growth, ratio, goal met."""
    peak = {(json.loads(r["sizes"])["images"], r["case"]): r["peak_mem_mb"] for r in rows if r["case"] != "study"}
    sizes = sorted({n for n, _ in peak})
    small, large = sizes[0], sizes[-1]
    goal = f"growth ≤ {GROWTH_MB:.0f} MB" if mode == "synthetic" else f"ratio ≤ {RATIO}"
    lines = [f"import baseline (a process importing {', '.join(PRELOAD)}): {baseline_mb:.0f} MB", "",
             f"| rule | peak at {small:,} images (MB) | peak at {large:,} (MB) | growth (MB) | ratio | {goal} |",
             "|---|---|---|---|---|---|"]
    for case in sorted({c for _, c in peak}):
        if (small, case) not in peak or (large, case) not in peak:  # a rule of one size only: shown, not judged
            a, b = peak.get((small, case)), peak.get((large, case))
            lines.append(f"| {case} | {'–' if a is None else f'{a:,.0f}'} | {'–' if b is None else f'{b:,.0f}'} "
                         "| – | – | n/a |")
            continue
        a, b = peak[small, case], peak[large, case]
        ok = (b - a <= GROWTH_MB) if mode == "synthetic" else (b <= RATIO * a)
        lines.append(f"| {case} | {a:,.0f} | {b:,.0f} | {b - a:+,.0f} | {b / a:.2f}× | {'yes' if ok else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["synthetic", "fashion"], default="synthetic")
    p.add_argument("--sizes", default="1000,16000", help="synthetic: comma-separated image counts")
    p.add_argument("--limits", default="233,none",
                   help="fashion: comma-separated limit_per_class values (none: the whole dataset)")
    p.add_argument("--studies", default="privacy,fusion", help="besides the shard training: privacy, fusion (or none)")
    p.add_argument("--shards", default="10",
                   help="synthetic: comma-separated N of the shard training (the fusion study takes the largest)")
    p.add_argument("--img-size", type=int, default=224, help="synthetic: image side in pixels")
    p.add_argument("--every", type=int, default=1, help="synthetic: LAST side-block spacing g (the blocks cache keeps 12/g + 1)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default: synthetic 1, fashion 2)")
    p.add_argument("--targets", default="all", help="comma-separated Snakemake targets")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--work", default="/tmp/bench_scale", help="datasets and studies go here")
    p.add_argument("--out-dir", default=str(REPO / "results" / "benchmarks"))
    args = p.parse_args()
    args.shards = [int(n) for n in args.shards.split(",")]
    args.studies = {s for s in args.studies.split(",") if s and s != "none"}
    args.targets = args.targets.split(",")
    args.epochs = args.epochs or (1 if args.mode == "synthetic" else 2)
    baseline, wall = import_baseline()
    rows = [benchmark_row("bench_scale", "baseline", "cpu", {"mode": args.mode, "imports": list(PRELOAD)}, [wall * 1e3],
                          baseline, method="os.wait4 ru_maxrss of a process importing the fork server's PRELOAD")]
    path = Path(args.out_dir) / f"bench_scale_{args.mode}.parquet"

    def save(new: list[dict]) -> None:  # after every size: a later size that fails keeps the earlier rows
        rows.extend(new)
        write_benchmark_rows(f"bench_scale_{args.mode}", rows, args.out_dir)

    if args.mode == "synthetic":
        for n in (int(s) for s in args.sizes.split(",")):
            data = Path(args.work) / f"data{n}_{args.img_size}px"
            make_image_folder(data, n, args.img_size)
            cfg = synthetic_config(data, args)
            save(run_size(f"n{n}", cfg, counts(cfg)[0], {"mode": "synthetic", "img_size": args.img_size,
                                                         "shards": ",".join(map(str, args.shards)), "every": args.every}, args))
    else:
        for limit in (None if s.lower() in ("none", "null", "full") else int(s) for s in args.limits.split(",")):
            cfg = fashion_config(limit, args)
            save(run_size(f"fashion_{limit or 'all'}", cfg, counts(cfg)[0],
                          {"mode": "fashion", "limit_per_class": limit, "epochs": args.epochs}, args))
    print(f"wrote {len(rows)} rows to {path}")
    if len({json.loads(r["sizes"]).get("images") for r in rows if r["case"] not in ("study", "baseline")}) > 1:
        table = summary([r for r in rows if r["case"] != "baseline"], baseline, args.mode)
        (Path(args.work) / f"summary_{args.mode}.md").write_text(table)
        print(table)


if __name__ == "__main__":
    main()
