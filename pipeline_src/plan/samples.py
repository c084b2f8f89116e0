"""Datasets: the samples table (stable sample ids, task, split, label) and its images.

Two sources share one code path after listing:
- `digits`: scikit-learn's `load_digits` (ships with the package, so the default runs offline);
- `imagefolder`: a tree `root/<class>/<image>` on disk, as torchvision's ImageFolder.

Classes in `dataset.source_classes` form the *source* task (used to pretrain the embedded
backbone); the remaining classes, relabelled 0..K-1 in sorted order, form the *target* task
that every fine-tuning method trains on. Splits are stratified and seeded, so the same config
always gives the same table.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}

SAMPLES_SCHEMA = pa.schema([
    ("sample_id", pa.string()),    # stable: "<source>/<class>/<index or file name>"
    ("row", pa.int64()),           # row of this sample in images.safetensors
    ("task", pa.string()),         # "source" (pretraining) or "target" (fine-tuning)
    ("split", pa.string()),        # "train" | "val" | "test"
    ("label", pa.int64()),         # label within its task
    ("class_name", pa.string()),
])


@dataclass
class SampleList:
    """Samples before images are decoded."""

    sample_ids: list[str]
    class_names: list[str]      # per sample
    paths: list[str] | None     # per sample, for image files


def list_samples(dataset_cfg: dict) -> SampleList:
    """List sample ids and classes without decoding any image."""
    if dataset_cfg["source"] == "digits":
        from sklearn.datasets import load_digits

        y = load_digits().target
        return SampleList([f"digits/{c}/{i:04d}" for i, c in enumerate(y)], [str(c) for c in y], None)
    root = Path(dataset_cfg["path"])
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"dataset.path {root}: no class folders found")
    ids, names, paths = [], [], []
    for c in classes:
        for f in sorted((root / c).rglob("*")):
            if f.suffix.lower() in IMAGE_SUFFIXES:
                ids.append(f"{root.name}/{c}/{f.relative_to(root / c).as_posix()}")
                names.append(c)
                paths.append(str(f))
    return SampleList(ids, names, paths)


def _class_order(names: list[str]) -> list[str]:
    # Numeric class names sort numerically (digits: "10" after "9"), others alphabetically.
    uniq = set(names)
    return sorted(uniq, key=int) if all(n.isdigit() for n in uniq) else sorted(uniq)


def assign_splits(samples: SampleList, dataset_cfg: dict, seed: int) -> pa.Table:
    """Build the samples table: task, stratified seeded split and label per sample."""
    source = {str(c) for c in dataset_cfg["source_classes"]}
    order = _class_order(samples.class_names)
    unknown = source - set(order)
    if unknown:
        raise ValueError(f"dataset.source_classes: classes {sorted(unknown)} not in the dataset")
    labels_of = {t: {c: i for i, c in enumerate(c for c in order if (c in source) == (t == "source"))}
                 for t in ("source", "target")}
    n = len(samples.sample_ids)
    task = np.array(["source" if c in source else "target" for c in samples.class_names])
    split = np.empty(n, dtype=object)
    rng = np.random.default_rng(seed)
    names = np.array(samples.class_names)
    for c in order:
        idx = np.flatnonzero(names == c)
        idx = idx[rng.permutation(len(idx))]
        n_test = int(round(len(idx) * dataset_cfg["test_fraction"]))
        n_val = int(round(len(idx) * dataset_cfg["val_fraction"]))
        split[idx[:n_test]] = "test"
        split[idx[n_test:n_test + n_val]] = "val"
        split[idx[n_test + n_val:]] = "train"
    label = [labels_of[t][c] for t, c in zip(task, samples.class_names)]
    return pa.Table.from_pydict({
        "sample_id": samples.sample_ids,
        "row": np.arange(n, dtype=np.int64),
        "task": task.tolist(),
        "split": split.tolist(),
        "label": label,
        "class_name": samples.class_names,
    }, schema=SAMPLES_SCHEMA)


def count_train_samples(cfg: dict) -> int:
    """Number of target-task training samples the config yields (no image decoding)."""
    table = assign_splits(list_samples(cfg["dataset"]), cfg["dataset"], cfg["seed"])
    task, split = table.column("task").to_pylist(), table.column("split").to_pylist()
    return sum(t == "target" and s == "train" for t, s in zip(task, split))
