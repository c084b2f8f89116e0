"""A real Snakemake run that trains from images with augmentation and DataLoader workers, on a
CSV manifest layout: the keys reach the jobs, the jobs log images/s per epoch, and evaluation runs."""
from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import results_of, snakemake

pytestmark = pytest.mark.e2e
METRICS = [f"results/augment/metrics/evaluate/{m}/n2_s0/{p}.parquet" for m in ("nlft-1",)
           for p in ("shards", "soup")]


def make_manifest(root: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = []
    for c in "0123":
        (root / "img" / c).mkdir(parents=True)
        for i in range(16):
            Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(root / "img" / c / f"{i}.png")
            rows.append([f"img/{c}/{i}.png", c])
    with open(root / "manifest.csv", "w", newline="") as f:
        csv.writer(f).writerows([["path", "label"], *rows])
    return root / "manifest.csv"


def test_augmented_training_from_images(tmp_path):
    manifest = make_manifest(tmp_path / "data")
    cfg = {"experiment": "augment", "dataset": {"source": "imagefolder", "layout": "manifest", "path": str(manifest),
                                                 "img_size": 8, "in_chans": 1, "source_classes": [0, 1]},
           "backbone": {"source": "pretrain", "arch": {"patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2},
                        "pretrain": {"epochs": 1, "batch_size": 64}},
           "features": {"cache": False},
           "train": {"epochs": 2, "batch_size": 8, "num_workers": 1, "augment": {"enabled": True, "hflip": 0.0}},
           "methods": {"nlft-1": {"kind": "nlft", "k": 1}}, "shards": [2],
           "compositions": ["soup"]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(tmp_path, "--cores", "2", *METRICS)
    log = (results_of(tmp_path) / "logs/train/nlft-1/n2_s0/shard1.log").read_text()
    assert re.search(r"nlft-1 n2 shard 1: epoch 2/2 loss [\d.]+: \d+ images in [\d.]+ s, [\d.]+ images/s", log), log
    for path in METRICS:
        assert pq.read_table(tmp_path / path).num_rows > 0
    assert not (results_of(tmp_path) / "features").exists()  # no cache was built
