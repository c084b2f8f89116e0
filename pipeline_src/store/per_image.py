"""Per-image records of an evaluation: which test image each evaluated model got right.

The claims' paired tests (`reports/paired_bootstrap.py`) resample test images, so every
evaluation that writes a metrics file `results/<experiment>/metrics/<...>.parquet` also writes,
in the parallel tree `results/<experiment>/per_image/<...>.parquet`, one row per (model, image):
the metrics row's context columns, the image's `sample_id`, its label, the predicted label and
whether they match. Only evaluated (test / validation) images are named, never training images:
the test and validation splits share no sample with any model's training data, so a DP model's
per-image file names no training member (docs/privacy.md, the release boundary).
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import torch

from pipeline_src.store.atomic import write_parquet

PER_IMAGE_SCHEMA = pa.schema([
    ("experiment", pa.string()), ("method", pa.string()), ("kind", pa.string()), ("model", pa.string()),
    ("shards", pa.int32()), ("shard_id", pa.int32()), ("seed", pa.int32()), ("split", pa.string()),
    ("variant", pa.string()), ("sample_id", pa.string()), ("label", pa.int32()), ("predicted", pa.int32()),
    ("correct", pa.bool_()),
])
CONTEXT = ("experiment", "method", "kind", "model", "shards", "shard_id", "seed", "split", "variant")


def per_image_path(metrics_path: str | Path) -> Path:
    """The per-image file of a metrics file: its last `metrics` folder swapped for `per_image`, or,
    for a metrics file outside a study's tree (a step run on its own), `<name>.per_image.parquet`
    beside it.

    Args:
        metrics_path: a metrics Parquet file, in a study under `.../metrics/...`.
    """
    parts = list(Path(metrics_path).parts)
    if "metrics" not in parts[:-1]:
        return Path(metrics_path).with_suffix(".per_image.parquet")
    at = len(parts) - 2 - parts[:-1][::-1].index("metrics")
    parts[at] = "per_image"
    return Path(*parts)


def per_image_rows(logits: torch.Tensor, labels: torch.Tensor, sample_ids: list[str], context: dict) -> list[dict]:
    """One row per image of one model's predictions.

    Args:
        logits: (images, classes) of one model.
        labels: (images,) true labels, in `sample_ids`' order.
        sample_ids: the evaluated images' ids.
        context: the metrics row's context (keys of `CONTEXT`; missing ones are NULL).
    """
    if len(sample_ids) != len(logits) or len(labels) != len(logits):
        raise ValueError(f"per_image_rows: {len(sample_ids)} ids, {len(labels)} labels, {len(logits)} logit rows")
    predicted = logits.argmax(-1).tolist()
    fixed = {k: context.get(k) for k in CONTEXT}
    return [{**fixed, "sample_id": s, "label": int(y), "predicted": int(p), "correct": int(y) == int(p)}
            for s, y, p in zip(sample_ids, labels.tolist(), predicted)]


def write_per_image(rows: list[dict], metrics_path: str | Path) -> Path:
    """Write `rows` atomically as the per-image file of `metrics_path`; its path."""
    path = per_image_path(metrics_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(pa.Table.from_pylist(rows, schema=PER_IMAGE_SCHEMA), path)
    return path
