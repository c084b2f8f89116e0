"""Corrupt images in a real Snakemake run: skipped consistently everywhere with
`dataset.skip_corrupt: true` (samples table, image store, shard manifests, trained models), or a
config error naming the file without it, before any job runs. The dataset uses the `split_folders` layout."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline_src.data.npy_rows import NpyRows
from pipeline_src.store.model_io import record_path
from tests.conftest import results_of, snakemake

pytestmark = pytest.mark.e2e
N = 2
TARGETS = [f"results/corrupt/metrics/evaluate/fc/n{N}_s0/shards.parquet"]


def make_dataset(root: Path) -> tuple[str, str]:
    """split_folders: classes 0..3 (0, 1: the pretraining task), a truncated PNG and a text file
    named .jpg among class 2's training images. Returns the two bad files."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 2), ("test", 4)):
        for c in "0123":
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(root / split / c / f"{i:02d}.png")
    good = (root / "train" / "2" / "00.png").read_bytes()
    truncated, text = root / "train" / "2" / "truncated.png", root / "train" / "2" / "text.jpg"
    truncated.write_bytes(good[: len(good) // 2])
    text.write_text("this is not a JPEG")
    return str(truncated), str(text)


def study(workdir: Path, **dataset) -> Path:
    root = workdir / "data"
    bad = make_dataset(root)
    cfg = {"experiment": "corrupt", "dataset": {"source": "imagefolder", "path": str(root), "img_size": 8,
                                                 "in_chans": 1, "source_classes": [0, 1], **dataset},
           "backbone": {"source": "pretrain", "arch": {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2},
                        "pretrain": {"epochs": 1, "batch_size": 64}},
           "train": {"epochs": 1, "batch_size": 64}, "methods": {"fc": {"kind": "fc"}}, "shards": [N]}
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    return bad


def test_skipped_everywhere_with_skip_corrupt(tmp_path):
    truncated, text = study(tmp_path, layout="split_folders", skip_corrupt=True)
    proc = snakemake(tmp_path, "--cores", "2", *TARGETS)
    assert "2 corrupt images skipped" in proc.stderr  # said at validation
    with open(results_of(tmp_path) / "prepare/corrupt.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["path"] for r in rows) == sorted([truncated, text])
    assert "skipped 2 corrupt images" in (results_of(tmp_path) / "logs/prepare/prepare.log").read_text()
    samples = pq.read_table(results_of(tmp_path) / "prepare/samples.parquet").to_pydict()
    assert len(samples["sample_id"]) == 4 * 18 == len(NpyRows(results_of(tmp_path) / "prepare/images.npy"))
    assert all(s == i.split("/")[1] for i, s in zip(samples["sample_id"], samples["split"]))  # as given
    bad_ids = {"data/train/2/truncated.png", "data/train/2/text.jpg"}
    assert not bad_ids & set(samples["sample_id"])
    members = []
    for i in range(N):
        members += pq.read_table(results_of(tmp_path) / f"split/n{N}_s0/shard{i}.parquet").column("sample_id").to_pylist()
        record = record_path(results_of(tmp_path) / f"train/fc/n{N}_s0/shard{i}.safetensors")
        members_of_model = json.loads(record.read_text())["sample_ids"]
        assert not bad_ids & set(members_of_model)
    target_train = {i for i, t, s in zip(samples["sample_id"], samples["task"], samples["split"])
                    if t == "target" and s == "train"}
    assert set(members) == target_train and len(target_train) == 24
    dry = snakemake(tmp_path, "-n", "--cores", "2", *TARGETS)  # the cached verdicts change nothing
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_without_skip_corrupt_a_new_bad_image_fails_before_any_job(tmp_path):
    """One corrupt image added to an existing study (issue 24, item 3): before the fix validation
    passed, `prepare` failed and Snakemake deleted its outputs first (samples table, image store)."""
    truncated, text = study(tmp_path, layout="split_folders")
    data = {p: Path(p).read_bytes() for p in (truncated, text)}
    for p in data:
        Path(p).unlink()
    snakemake(tmp_path, "--cores", "1", "results/corrupt/prepare/samples.parquet")  # the existing study
    before = {f: f.read_bytes() for f in results_of(tmp_path).rglob("*") if f.is_file() and ".plan_cache" not in f.parts}
    Path(truncated).write_bytes(data[truncated])  # then one bad image lands in the dataset
    proc = snakemake(tmp_path, "--cores", "1", "results/corrupt/prepare/samples.parquet", check=False)
    assert proc.returncode != 0
    assert f"config key 'dataset.path': 1 image(s) do not decode, e.g. {truncated}" in proc.stderr
    assert "skip_corrupt" in proc.stderr and "rule prepare" not in proc.stdout + proc.stderr  # no job started
    after = {f: f.read_bytes() for f in results_of(tmp_path).rglob("*") if f.is_file() and ".plan_cache" not in f.parts}
    assert after == before
