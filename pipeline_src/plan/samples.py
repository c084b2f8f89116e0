"""Datasets: the samples table (stable sample ids, task, split, label) and its images.

Three sources share one code path after listing:
- `digits`: scikit-learn's `load_digits` (ships with the package, so the default runs offline);
- `imagefolder`: image files on disk, in one of the layouts of `dataset_layouts.py` (class
  folders, split folders, or a CSV/Parquet manifest);
- `idx`: MNIST-family IDX files (`idx_files.py`; Fashion-MNIST from Debian by default), the
  official train/test split kept and val drawn from train.

Classes in `dataset.source_classes` form the *source* task (used to pretrain the embedded
backbone); the remaining classes, relabelled 0..K-1 in sorted order, form the *target* task
that every fine-tuning method trains on. Splits are the layout's own when it gives them, else
they come from a keyed hash of each sample id (seeded, stratified in expectation), so the same
config always gives the same table and new samples never move old ones. `dataset.limit_per_class`
keeps at most that many samples per class and split, the ones with the smallest keyed hash: a
subset of the same study, the same for every run (`dataset.source_limit_per_class` likewise for the
source classes, so the backbone can keep its pretraining data while the target task shrinks;
`dataset.test_limit_per_class` for the target test split, so a study can test on every test image).
With `dataset.pretrain_pool` the source task is instead a keyed-hash pool of the training split
(`pretrain_pool.py`), of every class or a chosen set, disjoint from every target sample.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline_src.plan.arrow_tables import table_from_columns
from pipeline_src.plan.dataset_layouts import LAYOUTS, SampleList, check_given_splits
from pipeline_src.plan.idx_files import list_idx
from pipeline_src.plan.image_check import drop_corrupt, refuse_corrupt
from pipeline_src.plan.pretrain_pool import check_disjoint, draw_pool, named_classes, pool_class_names
from pipeline_src.plan.sharding import keyed_units

SAMPLES_SCHEMA = pa.schema([
    ("sample_id", pa.string()),    # stable: "<source>/<class>/<index or file name>"
    ("row", pa.int64()),           # row of this sample in images.npy (and the feature caches)
    ("task", pa.string()),         # "source" (pretraining) or "target" (fine-tuning)
    ("split", pa.string()),        # "train" | "val" | "test"
    ("label", pa.int64()),         # label within its task
    ("class_name", pa.string()),
])


def digits_csv() -> Path:
    """The CSV scikit-learn's `load_digits` reads (`datasets/data/digits.csv.gz`: 64 pixel values
    0..16 then the label, a row per image), found without importing scikit-learn: its import costs
    seconds of a parse, and a second of every fork server's start (`runner/forkserver.py`)."""
    from importlib.util import find_spec

    spec = find_spec("sklearn")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("dataset.source 'digits' needs scikit-learn installed")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def digits_labels() -> list[int]:
    """The labels of scikit-learn's `load_digits`, read from its CSV (`digits_csv`, last column)."""
    import gzip

    with gzip.open(digits_csv(), "rt") as f:
        return [int(float(line.rsplit(",", 1)[1])) for line in f if line.strip()]


def list_samples(dataset_cfg: dict) -> SampleList:
    """List sample ids and classes (`dataset_layouts.py` for the layouts on disk) and check that
    every image decodes (`image_check.py`, verdicts cached per file): with `dataset.skip_corrupt`
    the images that do not are dropped, without it they are an error naming them."""
    if dataset_cfg["source"] == "digits":
        y = digits_labels()
        return SampleList([f"digits/{c}/{i:04d}" for i, c in enumerate(y)], [str(c) for c in y], None,
                          source_rows=list(range(len(y))))
    if dataset_cfg["source"] == "idx":
        return list_idx(dataset_cfg)
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


def source_class_names(dataset_cfg: dict, order: list[str]) -> set[str]:
    """The names of `dataset.source_classes`: a name as given; an integer is a label, named by
    `dataset.class_names` when the source has names (idx), else its own string (digits, a folder "3")."""
    return named_classes(dataset_cfg["source_classes"], order, dataset_cfg.get("class_names") or [],
                         "dataset.source_classes")


def _limit(limits: dict, task: str, class_name: str, split: str) -> int | None:
    """The cap of one (task, class, split) group: the target test split has its own."""
    return limits["target test"] if (task, split) == ("target", "test") else limits[task]


def split_and_limit(samples: SampleList, dataset_cfg: dict, seed: int) -> SampleList:
    """The samples the study uses, each with its split: the layout's splits as given, or drawn
    from a keyed hash of the sample id (val from train when the source gives train/test only);
    then at most `dataset.limit_per_class` per target class and split (`dataset.test_limit_per_class`
    for the target test split: `same`, that limit; null, every test image), and
    `dataset.source_limit_per_class` per source class and split. Idempotent, so `prepare` and the
    parse-time table select the same samples.

    The split of a drawn sample: u = keyed_unit(id, 'split/<seed>'), test if u < test_fraction,
    val if u < test_fraction + val_fraction, else train (for val drawn from train: val if
    u < val_fraction). The limit keeps the samples with the smallest keyed_unit(id, 'limit/<seed>').
    """
    test_end = dataset_cfg["test_fraction"]
    val_end = test_end + dataset_cfg["val_fraction"]
    if samples.splits is not None and not samples.val_from_train:  # the layout's own splits
        split = np.array(samples.splits, dtype=object)
    else:
        u = keyed_units(samples.sample_ids, f"split/{seed}")
        if samples.val_from_train:
            given = np.array(samples.splits, dtype=object)
            split = np.where((given == "train") & (u < dataset_cfg["val_fraction"]), "val", given).astype(object)
        else:
            split = np.where(u < test_end, "test", np.where(u < val_end, "val", "train")).astype(object)
    out = replace(samples, splits=split.tolist(), val_from_train=False)
    order = samples.class_order or _class_order(samples.class_names)
    pool_cfg = dataset_cfg.get("pretrain_pool")
    if pool_cfg and out.tasks is None:  # drawn once: a second call sees the pool's own splits
        tasks, splits, keep = draw_pool(out.sample_ids, out.class_names, out.splits, pool_cfg,
                                        pool_class_names(pool_cfg, order, dataset_cfg.get("class_names") or []),
                                        source_class_names(dataset_cfg, order))
        out = replace(out.pick(keep), splits=splits, tasks=tasks)
        split = np.array(splits, dtype=object)
    limits = {"target": dataset_cfg.get("limit_per_class"), "source": dataset_cfg.get("source_limit_per_class")}
    test_limit = dataset_cfg.get("test_limit_per_class", "same")
    limits["target test"] = limits["target"] if test_limit == "same" else test_limit
    if not any(limits.values()):
        return out
    if out.tasks is None:
        source = source_class_names(dataset_cfg, order)
        tasks = ["source" if c in source else "target" for c in out.class_names]
    else:
        tasks = out.tasks
    u = keyed_units(out.sample_ids, f"limit/{seed}")
    names, groups = np.unique(np.array([f"{t}\0{c}\0{s}" for t, c, s in zip(tasks, out.class_names, split)]),
                              return_inverse=True)
    cap = np.array([_limit(limits, *n.split("\0")) or len(split) for n in names])[groups]
    order = np.lexsort((u, groups))  # by group, then by hash
    first = np.searchsorted(groups[order], groups[order], side="left")
    keep = np.sort(order[np.arange(len(order)) - first < cap[order]])  # listing order kept
    return out.pick(keep.tolist())


def assign_splits(samples: SampleList, dataset_cfg: dict, seed: int) -> pa.Table:
    """Build the samples table of the samples `split_and_limit` selects: task, split and label.

    Source classes (`dataset.source_classes`) form the source task, the others the target task;
    each task's labels follow the source's class order (idx: its labels; else numeric names
    numerically, other names alphabetically).
    """
    samples = split_and_limit(samples, dataset_cfg, seed)
    order = samples.class_order or _class_order(samples.class_names)
    order = [c for c in order if c in set(samples.class_names)]
    if samples.tasks is not None:  # a pretraining pool: each task's classes are those its samples have
        task = np.array(samples.tasks, dtype=object)
        present = {t: {c for c, x in zip(samples.class_names, samples.tasks) if x == t} for t in ("source", "target")}
    else:
        source = source_class_names(dataset_cfg, order)
        task = np.array(["source" if c in source else "target" for c in samples.class_names], dtype=object)
        present = {t: {c for c in samples.class_names if (c in source) == (t == "source")} for t in ("source", "target")}
    labels_of = {t: {c: i for i, c in enumerate(c for c in order if c in present[t])} for t in ("source", "target")}
    n = len(samples.sample_ids)
    label = [labels_of[t][c] for t, c in zip(task, samples.class_names)]
    return table_from_columns({  # not pa.Table.from_pydict: that imports pandas (arrow_tables.py)
        "sample_id": samples.sample_ids,
        "row": np.arange(n, dtype=np.int64),
        "task": task.tolist(),
        "split": samples.splits,
        "label": label,
        "class_name": samples.class_names,
    }, SAMPLES_SCHEMA)


_STUDY_SAMPLES: dict[tuple[str, int], tuple[SampleList, pa.Table]] = {}  # (dataset config, seed) → its samples


def study_samples(dataset_cfg: dict, seed: int, fresh: bool = False) -> tuple[SampleList, pa.Table]:
    """The listing and the samples table `prepare` will write (no image decoding), kept per
    (dataset config, seed) so that validation, the forget plans and the shard manifests of one
    DAG build list and split the dataset once (the Fashion study's keyed hashes took a tenth of a
    dry run when each drew them anew). Validation asks for a `fresh` one, so a process that
    validates again (a test, a second workflow) sees the files as they are now. Callers must not
    change what it returns.

    Args:
        dataset_cfg: the config's `dataset` section.
        seed: the config's `seed`.
        fresh: list and split again even when kept, and keep the new result.
    """
    key = (json.dumps(dataset_cfg, sort_keys=True), seed)
    if fresh or key not in _STUDY_SAMPLES:
        listed = list_samples(dataset_cfg)
        table = assign_splits(listed, dataset_cfg, seed)
        _STUDY_SAMPLES.pop(key, None)
        while len(_STUDY_SAMPLES) >= 4:  # a few configs at most: tests, the near/far studies
            _STUDY_SAMPLES.pop(next(iter(_STUDY_SAMPLES)))
        _STUDY_SAMPLES[key] = (listed, table)
    return _STUDY_SAMPLES[key]


def count_train_samples(cfg: dict) -> int:
    """Number of target-task training samples the config yields (no image decoding)."""
    listed, table = study_samples(cfg["dataset"], cfg["seed"], fresh=True)  # validation: as the files are now
    print(dataset_summary(cfg["dataset"], listed, table), file=sys.stderr)  # shown at validation
    if cfg["dataset"].get("pretrain_pool"):
        check_disjoint(table, cfg["dataset"]["pretrain_pool"])  # before any job: prepare asserts it again
    task, split = table.column("task").to_pylist(), table.column("split").to_pylist()
    return sum(t == "target" and s == "train" for t, s in zip(task, split))


def dataset_summary(dataset_cfg: dict, samples: SampleList, table: pa.Table) -> str:
    """One line: classes and images per task and split, and what listing skipped or dropped."""
    rows = list(zip(table.column("task").to_pylist(), table.column("split").to_pylist()))
    names = table.column("class_name").to_pylist()
    per_task_split = Counter(rows)
    parts = []
    for task in ("target", "source"):
        n_classes = len({c for c, (t, _) in zip(names, rows) if t == task})
        if n_classes:
            counts = "/".join(str(per_task_split[task, s]) for s in ("train", "val", "test"))
            parts.append(f"{task} {n_classes} classes, train/val/test {counts} images")
    layout = dataset_cfg.get("layout", "folders")
    name = dataset_cfg["source"] + ("" if samples.paths is None or layout == "folders" else f" ({layout})")
    line = f"dataset {name}: {len(set(samples.class_names))} classes; " + "; ".join(parts)
    if samples.val_from_train:
        line += "; train/test as given, val drawn from train"
    elif samples.splits is not None:
        line += "; splits as given"
    pool = dataset_cfg.get("pretrain_pool")
    if pool:
        line += (f"; source = the pretraining pool (dataset.pretrain_pool: fraction {pool['fraction']} of the training "
                 f"split, key pool/{pool['seed']}), disjoint from every target sample")
    for key, task in (("limit_per_class", "target"), ("source_limit_per_class", "source")):
        if dataset_cfg.get(key):
            line += f"; at most {dataset_cfg[key]} per {task} class and split (dataset.{key})"
    test_limit = dataset_cfg.get("test_limit_per_class", "same")
    if test_limit != "same" and test_limit != dataset_cfg.get("limit_per_class"):
        line += f"; target test: {'every image' if test_limit is None else f'at most {test_limit} per class'} " \
                "(dataset.test_limit_per_class)"
    if samples.corrupt:
        line += f"; {len(samples.corrupt)} corrupt images skipped (e.g. {samples.corrupt[0][0]})"
    if samples.paths is not None and layout != "manifest":
        line += f"; {len(samples.skipped)} non-image files skipped"
        if samples.skipped:
            line += f" (e.g. {samples.skipped[0]})"
    if samples.empty_classes:
        line += f"; empty class folders dropped: {samples.empty_classes}"
    return line

