"""Peak memory of `prepare`, `features` and a shard `train` job does not grow with the dataset.

Each step runs in a fresh process (`memory_probe.py`) on ImageFolders of 100 and 400 RGB
images at 64 px (a ViT with 257 tokens of width 64, depth 4: the `blocks` cache is 329 KB per
image in float32, 164 KB in float16). The shard count grows with the data (2 and 8), so a
shard holds about 50 images in both. Reading whole stores, as the code before issue 12 did,
adds at least the 300 extra images' float32 features (99 MB) to `features` and `train`;
here each step's peak RSS may grow by at most 20 MB.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from tests.conftest import REPO

GROWTH_LIMIT_KB = 20 * 1024


def image_folder(root, n: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(n)
    for i in range(n):
        c = root / "abc"[i % 3]
        c.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(c / f"img{i:04d}.png")


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
    assert all(g < GROWTH_LIMIT_KB for g in growth.values()), f"RSS growth 100 -> 400 images (KB): {growth}"
