"""Datasets: the samples table (stable sample ids, task, split, label) and its images.

Two sources share one code path after listing:
- `digits`: scikit-learn's `load_digits` (ships with the package, so the default runs offline);
- `imagefolder`: image files on disk, in one of the layouts of `dataset_layouts.py` (class
  folders, split folders, or a CSV/Parquet manifest).

Classes in `dataset.source_classes` form the *source* task (used to pretrain the embedded
backbone); the remaining classes, relabelled 0..K-1 in sorted order, form the *target* task
that every fine-tuning method trains on. Splits are the layout's own when it gives them, else
they come from a keyed hash of each sample id (seeded, stratified in expectation), so the same
config always gives the same table and new samples never move old ones.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline_src.plan.dataset_layouts import LAYOUTS, SampleList, check_given_splits
from pipeline_src.plan.image_check import drop_corrupt, refuse_corrupt
from pipeline_src.plan.sharding import keyed_unit

SAMPLES_SCHEMA = pa.schema([
    ("sample_id", pa.string()),    # stable: "<source>/<class>/<index or file name>"
    ("row", pa.int64()),           # row of this sample in images.npy (and the feature caches)
    ("task", pa.string()),         # "source" (pretraining) or "target" (fine-tuning)
    ("split", pa.string()),        # "train" | "val" | "test"
    ("label", pa.int64()),         # label within its task
    ("class_name", pa.string()),
])


def digits_labels() -> list[int]:
    """The labels of scikit-learn's `load_digits`, read from the CSV it ships (last column)
    without importing scikit-learn: listing runs at parse time, where its import costs seconds."""
    import gzip
    from importlib.util import find_spec

    spec = find_spec("sklearn")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("dataset.source 'digits' needs scikit-learn installed")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        return [int(float(line.rsplit(",", 1)[1])) for line in f if line.strip()]


def list_samples(dataset_cfg: dict) -> SampleList:
    """List sample ids and classes (`dataset_layouts.py` for the layouts on disk) and check that
    every image decodes (`image_check.py`, verdicts cached per file): with `dataset.skip_corrupt`
    the images that do not are dropped, without it they are an error naming them."""
    if dataset_cfg["source"] == "digits":
        y = digits_labels()
        return SampleList([f"digits/{c}/{i:04d}" for i, c in enumerate(y)], [str(c) for c in y], None)
    samples = LAYOUTS[dataset_cfg.get("layout", "folders")](dataset_cfg)
    if not dataset_cfg.get("skip_corrupt", False):
        refuse_corrupt(samples)
    else:
        before = set(samples.class_names)
        samples = drop_corrupt(samples)
        gone = sorted(before - set(samples.class_names))
        if gone and not dataset_cfg.get("allow_empty_classes", False):  # as an empty class folder
            raise ValueError(f"config key 'dataset.skip_corrupt': every image of classes {gone} is corrupt "
                             "(set dataset.allow_empty_classes: true to drop them)")
        samples.empty_classes += gone
    check_given_splits(samples, dataset_cfg["path"])
    return samples


def _class_order(names: list[str]) -> list[str]:
    # Numeric class names sort numerically (digits: "10" after "9"), others alphabetically.
    uniq = set(names)
    return sorted(uniq, key=int) if all(n.isdigit() for n in uniq) else sorted(uniq)


def assign_splits(samples: SampleList, dataset_cfg: dict, seed: int) -> pa.Table:
    """Build the samples table: task, split and label per sample.

    Splits given by the layout (`samples.splits`) are used as they are. Otherwise the split of a
    sample is a function of its own id: u = keyed_unit(id, 'split/<seed>'),
    test if u < test_fraction, val if u < test_fraction + val_fraction, else train. So the
    fractions hold per class in expectation, and adding or removing a sample never moves
    another one between splits (or shards: `sharding`).
    """
    source = {str(c) for c in dataset_cfg["source_classes"]}
    order = _class_order(samples.class_names)
    unknown = source - set(order)
    if unknown:
        raise ValueError(f"dataset.source_classes: classes {sorted(unknown)} not in the dataset")
    labels_of = {t: {c: i for i, c in enumerate(c for c in order if (c in source) == (t == "source"))}
                 for t in ("source", "target")}
    n = len(samples.sample_ids)
    task = np.array(["source" if c in source else "target" for c in samples.class_names])
    test_end = dataset_cfg["test_fraction"]
    val_end = test_end + dataset_cfg["val_fraction"]
    if samples.splits is not None:  # the layout's own splits, used as given
        split = np.array(samples.splits, dtype=object)
    else:
        u = np.array([keyed_unit(i, f"split/{seed}") for i in samples.sample_ids])
        split = np.where(u < test_end, "test", np.where(u < val_end, "val", "train")).astype(object)
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
    samples = list_samples(cfg["dataset"])
    table = assign_splits(samples, cfg["dataset"], cfg["seed"])
    print(dataset_summary(cfg["dataset"], samples, table), file=sys.stderr)  # shown at validation
    task, split = table.column("task").to_pylist(), table.column("split").to_pylist()
    return sum(t == "target" and s == "train" for t, s in zip(task, split))


def dataset_summary(dataset_cfg: dict, samples: SampleList, table: pa.Table) -> str:
    """One line: classes and images per task and split, and what listing skipped or dropped."""
    rows = list(zip(table.column("task").to_pylist(), table.column("split").to_pylist()))
    parts = []
    for task in ("target", "source"):
        n_classes = len({c for c, (t, _) in zip(samples.class_names, rows) if t == task})
        if n_classes:
            counts = "/".join(str(sum(r == (task, s) for r in rows)) for s in ("train", "val", "test"))
            parts.append(f"{task} {n_classes} classes, train/val/test {counts} images")
    layout = dataset_cfg.get("layout", "folders")
    name = dataset_cfg["source"] + ("" if samples.paths is None or layout == "folders" else f" ({layout})")
    line = f"dataset {name}: {len(set(samples.class_names))} classes; " + "; ".join(parts)
    if samples.splits is not None:
        line += "; splits as given"
    if samples.corrupt:
        line += f"; {len(samples.corrupt)} corrupt images skipped (e.g. {samples.corrupt[0][0]})"
    if samples.paths is not None and layout != "manifest":
        line += f"; {len(samples.skipped)} non-image files skipped"
        if samples.skipped:
            line += f" (e.g. {samples.skipped[0]})"
    if samples.empty_classes:
        line += f"; empty class folders dropped: {samples.empty_classes}"
    return line

