"""How images on disk are laid out (`dataset.layout`), listed without decoding any image.

- `folders`: `path/<class>/<image>`, torchvision's ImageFolder; splits are drawn by a keyed hash
  (`samples.assign_splits`).
- `split_folders`: `path/{train,val,test}/<class>/<image>`, the splits used as given (`val/`
  optional), as many public datasets ship.
- `manifest`: a CSV or Parquet file (`path`) with columns `path,label[,split]`; paths are relative
  to the manifest's folder or absolute, labels are class names, `split` (optional) is used as given.

Every error names the key, file or row, so it is raised at validation before any job runs.
Parse time: imports no torch.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
SPLITS = ("train", "val", "test")
MANIFEST_SUFFIXES = (".csv", ".parquet")


@dataclass
class SampleList:
    """Samples before images are decoded."""

    sample_ids: list[str]
    class_names: list[str]      # per sample
    paths: list[str] | None     # per sample, for image files
    skipped: list[str] = field(default_factory=list)       # files that are not images (by suffix)
    empty_classes: list[str] = field(default_factory=list)  # class folders without an image
    splits: list[str] | None = None  # per sample, when the layout gives them; None: keyed-hash split
    corrupt: list[tuple[str, str]] = field(default_factory=list)  # (path, reason) dropped by skip_corrupt
    source_rows: list[int] | None = None  # per sample, its row in the source's own arrays (digits, idx)
    class_order: list[str] | None = None  # label order of the classes, when the source fixes one (idx)
    val_from_train: bool = False  # given splits are train/test; val is drawn from train by the keyed hash (idx)
    tasks: list[str] | None = None  # per sample, once `dataset.pretrain_pool` has been drawn (plan/pretrain_pool.py)

    def pick(self, keep: list[int]) -> SampleList:
        """The listing of only these samples (positions, in order); what was skipped stays recorded."""
        sel = (lambda xs: None if xs is None else [xs[k] for k in keep])
        return replace(self, sample_ids=sel(self.sample_ids), class_names=sel(self.class_names), paths=sel(self.paths),
                       splits=sel(self.splits), source_rows=sel(self.source_rows), tasks=sel(self.tasks))


def _class_folders(root: Path, id_prefix: str) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """Images per class folder of `root` as (sample id, path), and the non-image files seen."""
    skipped = [str(f) for f in sorted(root.iterdir()) if f.is_file()]  # beside the class folders
    per_class: dict[str, list[tuple[str, str]]] = {}
    for c in sorted(p.name for p in root.iterdir() if p.is_dir()):
        files = [f for f in sorted((root / c).rglob("*")) if f.is_file()]
        skipped += [str(f) for f in files if f.suffix.lower() not in IMAGE_SUFFIXES]
        per_class[c] = [(f"{id_prefix}/{c}/{f.relative_to(root / c).as_posix()}", str(f))
                        for f in files if f.suffix.lower() in IMAGE_SUFFIXES]
    return per_class, skipped


def _drop_empty(per_class: dict[str, list], root: Path, dataset_cfg: dict) -> list[str]:
    empty = [c for c, items in per_class.items() if not items]
    if empty and not dataset_cfg.get("allow_empty_classes", False):
        # Dropping it silently would change the label count, and every label after it.
        raise ValueError(f"config key 'dataset.path': class folders without images in {root}: {empty} "
                         "(set dataset.allow_empty_classes: true to drop them)")
    return empty


def list_folders(dataset_cfg: dict) -> SampleList:
    """`folders`: one folder per class under `dataset.path`."""
    root = Path(dataset_cfg["path"])
    per_class, skipped = _class_folders(root, root.name)
    if not per_class:
        raise ValueError(f"config key 'dataset.path': no class folders found in {root}")
    empty = _drop_empty(per_class, root, dataset_cfg)
    items = [(i, c, p) for c, found in per_class.items() for i, p in found]
    return SampleList([i for i, _, _ in items], [c for _, c, _ in items], [p for _, _, p in items], skipped, empty)


def list_split_folders(dataset_cfg: dict) -> SampleList:
    """`split_folders`: `train/`, `val/` (optional) and `test/` under `dataset.path`, each holding
    class folders. Sample ids are `<root>/<split>/<class>/<file>`."""
    root = Path(dataset_cfg["path"])
    dirs = sorted(p.name for p in root.iterdir() if p.is_dir())
    unknown = [d for d in dirs if d not in SPLITS]
    if unknown:
        raise ValueError(f"config key 'dataset.layout': split_folders expects only {list(SPLITS)} folders in {root}, "
                         f"found {unknown}")
    for needed in ("train", "test"):
        if needed not in dirs:
            raise ValueError(f"config key 'dataset.layout': split_folders needs a '{needed}/' folder in {root}")
    skipped = [str(f) for f in sorted(root.iterdir()) if f.is_file()]
    ids, names, paths, splits = [], [], [], []
    per_class_all: dict[str, list] = {}
    for s in (d for d in SPLITS if d in dirs):
        per_class, skipped_here = _class_folders(root / s, f"{root.name}/{s}")
        skipped += skipped_here
        for c, found in per_class.items():
            per_class_all.setdefault(c, []).extend(found)
            for i, p in found:
                ids.append(i)
                names.append(c)
                paths.append(p)
                splits.append(s)
    if not per_class_all:
        raise ValueError(f"config key 'dataset.path': no class folders found under {root}/train")
    empty = _drop_empty(per_class_all, root, dataset_cfg)  # no image in any split
    return SampleList(ids, names, paths, skipped, empty, splits)


def _manifest_columns(path: Path) -> dict[str, list]:
    """The manifest's columns as lists of strings (None for a missing value)."""
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return {name: [None if v is None else str(v) for v in table.column(name).to_pylist()]
                for name in table.column_names}
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"config key 'dataset.path': manifest {path} is empty")
    header = [h.strip() for h in rows[0]]
    cols: dict[str, list] = {h: [] for h in header}
    for n, r in enumerate(rows[1:], start=1):
        if len(r) != len(header):
            raise ValueError(f"manifest {path}: row {n} has {len(r)} fields, the header {len(header)}")
        for h, v in zip(header, r):
            cols[h].append(v.strip() or None)
    return cols


def list_manifest(dataset_cfg: dict) -> SampleList:
    """`manifest`: the rows of a CSV or Parquet file with columns `path,label[,split]`.

    A relative path is read from the manifest's folder and gives the sample id
    `<folder name>/<path>`; an absolute path is its own id. Rows are numbered from 1 after the header.
    """
    path = Path(dataset_cfg["path"])
    cols = _manifest_columns(path)
    for needed in ("path", "label"):
        if needed not in cols:
            raise ValueError(f"manifest {path}: no '{needed}' column (columns: {sorted(cols)}; "
                             "needs path,label and optionally split)")
    base = path.parent
    has_split = "split" in cols
    ids, names, paths, splits = [], [], [], []
    row_of: dict[str, int] = {}
    for n, (p, label) in enumerate(zip(cols["path"], cols["label"]), start=1):
        if not p or not label:
            raise ValueError(f"manifest {path}: row {n} has an empty {'path' if not p else 'label'}")
        rel = Path(os.path.normpath(p))
        file = rel if rel.is_absolute() else base / rel
        if not file.is_file():
            raise ValueError(f"manifest {path}: row {n}: image file not found: {file}")
        sample_id = rel.as_posix() if rel.is_absolute() else f"{base.name}/{rel.as_posix()}"
        if sample_id in row_of:
            raise ValueError(f"manifest {path}: rows {row_of[sample_id]} and {n} name the same image {p}")
        row_of[sample_id] = n
        if has_split:
            s = cols["split"][n - 1]
            if s not in SPLITS:
                raise ValueError(f"manifest {path}: row {n}: unknown split {s!r} (one of {list(SPLITS)})")
            splits.append(s)
        ids.append(sample_id)
        names.append(label)
        paths.append(str(file))
    if not ids:
        raise ValueError(f"manifest {path}: no rows")
    return SampleList(ids, names, paths, splits=splits if has_split else None)


LAYOUTS = {"folders": list_folders, "split_folders": list_split_folders, "manifest": list_manifest}


def check_given_splits(samples: SampleList, where: str) -> None:
    """A class with val or test images but no training image cannot be learned: refuse it, naming it.

    Args:
        samples: a listing, with `splits` when the layout gives them (else nothing to check).
        where: the dataset path, for the message.
    """
    if samples.splits is None:
        return
    in_train = {c for c, s in zip(samples.class_names, samples.splits) if s == "train"}
    for c, s in zip(samples.class_names, samples.splits):
        if c not in in_train:
            raise ValueError(f"config key 'dataset.path': class '{c}' has {s} images but no training image in "
                             f"{where}")
