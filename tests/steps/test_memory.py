"""Peak memory of `prepare`, `features` and a shard `train` job does not grow with the dataset.

Each step runs in a fresh process (`memory_probe.py`) on ImageFolders of 100 and 400 RGB
images at 224 px (150 KB each decoded; a ViT/16 with 197 tokens of width 64, depth 4: the
`blocks` cache is 252 KB per image in float32). The shard count grows with the data (2 and 8),
so a shard holds about 50 images in both. Each step's peak RSS may grow by at most LIMIT_MB.

Measured growth from 100 to 400 images (MB; the same probe on each code):
    step       before issue 12 (whole stores in memory)   now
    prepare    +45                                         +5
    features   +551                                        +17
    train      +18 (safetensors maps the file)             +1
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from tests.conftest import REPO

LIMIT_MB = {"prepare": 20, "features": 40, "train": 10}


def image_folder(root, n: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(n)
    for i in range(n):
        c = root / "abc"[i % 3]
        c.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)).save(c / f"img{i:04d}.png")


def peak_kb(step: str, results, root, shards: int) -> int:
    proc = subprocess.run([sys.executable, "-m", "tests.steps.memory_probe", step, str(results), str(root), str(shards)],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return int(proc.stdout.strip().splitlines()[-1])


def test_peak_rss_does_not_grow_with_the_dataset(tmp_path):
    peaks = {}
    for n, shards in ((100, 2), (400, 8)):
        root, results = tmp_path / f"data{n}", tmp_path / f"results{n}"
        image_folder(root, n)
        peaks[n] = {step: peak_kb(step, results, root, shards) for step in ("prepare", "features", "train")}
    growth = {step: peaks[400][step] - peaks[100][step] for step in peaks[100]}
    print("peak RSS (MB):", {n: {s: round(v / 1024) for s, v in p.items()} for n, p in peaks.items()})
    assert all(growth[s] < LIMIT_MB[s] * 1024 for s in LIMIT_MB), f"RSS growth 100 -> 400 images (KB): {growth}"
