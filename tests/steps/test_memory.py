"""Peak memory of `prepare`, `features`, a shard `train` job, `fusion_match`, `fuse` and
`train_private` does not grow with the dataset.

Each step runs in its own child process, forked from one probe process that imported torch
once (`memory_probe.py`), with a real job's allocator settings (`runner/execute.job_allocator`),
on ImageFolders of 100 and 400 RGB images at 224 px (150 KB each decoded; a ViT/16 with 197
tokens of width 64, depth 4: the `blocks` cache is 252 KB per image in float32). The shard count
is fixed (N = 1), so the shard of the LAST jobs (g = 1: they read all 5 blocks) grows 4x with the
data (60 -> 238 training images), as in benchmarks/bench_scale.py; fusion_match and fuse (RegMean)
take that model and a copy as two shard models; train_private is DP-SGD (bk) of the LAST model.
Each step's peak RSS may grow by at most LIMIT_MB.

Measured growth from 100 to 400 images (MB):
    step           before issue 12      shard held       issue 12         before issue 25   now (release_freed
                   (whole stores)       (N = 1)          (one batch)      (this probe,       per batch, 4 MiB
                                                                          no pin)            pin; 2 runs)
    prepare        +45                  +5               +4 to +5         +5                 +3, +9
    features       +551                 +15              -6 to +6         +47 (13 passes)    -10, 0
    train          +18                  +42, +43         -2 to +7         +12                +4, -6
    fusion_match                                                          +103               0, 0
    fuse                                                                  +95                +12, +5
    train_private                                                         +74                +23, +1 (the
                                                                                             first with secret
                                                                                             Poisson coins)
The limits sit between the last two columns. The rest is allocator noise: five forks of the same
train job on the same 100 images peaked at 732-754 MB (2026-12-07), and one CI run measured
train +21 MB from single runs. So each step runs REPEATS times and its peak is the least of them:
a step that holds what grows with the data raises every run's peak, noise raises only some.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tests.conftest import REPO

LIMIT_MB = {"prepare": 20, "features": 40, "train": 20, "fusion_match": 25, "fuse": 25, "train_private": 30}
STEPS = tuple(LIMIT_MB)  # in run order: each reads the outputs of those before it
SIZES = (100, 400)
REPEATS = 3


def image_folder(root, n: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(n)
    for i in range(n):
        c = root / "abc"[i % 3]
        c.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)).save(c / f"img{i:04d}.png",
                                                                                 compress_level=1)


def test_peak_rss_does_not_grow_with_the_dataset(tmp_path):
    jobs = []
    for n in SIZES:
        image_folder(tmp_path / f"data{n}", n)
        jobs += [[step, str(tmp_path / f"n{n}" / "results"), str(tmp_path / f"data{n}"), "1"]
                 for step in STEPS for _ in range(REPEATS)]  # a rerun rewrites the same outputs
    proc = subprocess.run([sys.executable, "-m", "tests.steps.memory_probe", *(a for job in jobs for a in job)],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    kb = np.array(json.loads(proc.stdout.strip().splitlines()[-1])).reshape(len(SIZES), len(STEPS), REPEATS)
    peaks = {n: dict(zip(STEPS, kb[i].min(axis=1).tolist())) for i, n in enumerate(SIZES)}
    growth = {step: peaks[SIZES[1]][step] - peaks[SIZES[0]][step] for step in LIMIT_MB}
    print("peak RSS (MB):", {n: {s: round(v / 1024) for s, v in p.items()} for n, p in peaks.items()})
    assert all(growth[s] < LIMIT_MB[s] * 1024 for s in LIMIT_MB), f"RSS growth 100 -> 400 images (KB): {growth}"
