"""Per-image records of an evaluation: which test image each evaluated model got right.

The claims' paired tests (`reports/paired_bootstrap.py`) resample test images, so each test
evaluation the claims compare writes, beside its metrics file
`results/<experiment>/metrics/<...>.parquet`, the same path in the parallel tree
`results/<experiment>/per_image/<...>.parquet`: one row per (model, image), with the metrics row's
context columns (`variant` included: the study settings that pair rows across methods), the
image's `sample_id`, its label, the predicted label and whether they match. The writers are the
evaluate steps, the unlearning study's steps (`steps/forget/`), the DP study's evaluation
(`steps/privacy/evaluate.py`), the fusion study's `fuse` and the no-pretraining references
(`steps/baseline_*.py`); their rules declare the file as an
output (`per_image`), so a deleted one is rebuilt and a forced rerun replaces it.

Only test images are named, never training images: the test split shares no sample with any
model's training data, so a DP model's per-image file names no training member (docs/privacy.md,
the release boundary); it is private workspace all the same (owner-only in a DP study).
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import torch

from pipeline_src.plan.per_image_files import per_image_path
from pipeline_src.store.atomic import write_parquet

__all__ = ["PER_IMAGE_SCHEMA", "per_image_output", "per_image_path", "per_image_rows", "write_per_image"]

PER_IMAGE_SCHEMA = pa.schema([
    ("experiment", pa.string()), ("method", pa.string()), ("kind", pa.string()), ("model", pa.string()),
    ("shards", pa.int32()), ("shard_id", pa.int32()), ("seed", pa.int32()), ("split", pa.string()),
    ("variant", pa.string()), ("sample_id", pa.string()), ("label", pa.int32()), ("predicted", pa.int32()),
    ("correct", pa.bool_()),
])
CONTEXT = ("experiment", "method", "kind", "model", "shards", "shard_id", "seed", "split", "variant")


def per_image_rows(logits: torch.Tensor, labels: torch.Tensor, sample_ids: list[str], context: dict) -> list[dict]:
    """One row per image of one model's predictions.

    Args:
        logits: (images, classes) of one model.
        labels: (images,) true labels, in `sample_ids`' order.
        sample_ids: the evaluated images' ids.
        context: the metrics row's context (keys of `CONTEXT`; missing ones are NULL).
    """
    return prediction_rows(logits.argmax(-1), labels, sample_ids, context)


def prediction_rows(predicted: torch.Tensor, labels: torch.Tensor, sample_ids: list[str], context: dict) -> list[dict]:
    """One row per image of one model's predicted labels (a model without logits: a scikit-learn one).

    Args:
        predicted: (images,) predicted labels.
        labels: (images,) true labels, in `sample_ids`' order.
        sample_ids: the evaluated images' ids.
        context: the metrics row's context (keys of `CONTEXT`; missing ones are NULL).
    """
    if len(sample_ids) != len(predicted) or len(labels) != len(predicted):
        raise ValueError(f"per-image rows: {len(sample_ids)} ids, {len(labels)} labels, {len(predicted)} predictions")
    fixed = {k: context.get(k) for k in CONTEXT}
    return [{**fixed, "sample_id": s, "label": int(y), "predicted": int(p), "correct": int(y) == int(p)}
            for s, y, p in zip(sample_ids, labels.tolist(), predicted.tolist())]


def per_image_output(output) -> Path:
    """The per-image file a job writes: its rule's declared `per_image` output (so Snakemake
    rebuilds a deleted one and removes a stale one before a forced rerun), or, for a step run on
    its own with a metrics output only, `per_image_path` of that.

    Args:
        output: the job's outputs (`StepArgs.output`), with `metrics` and maybe `per_image`.
    """
    declared = getattr(output, "_names", {}).get("per_image")
    return Path(declared) if declared is not None else per_image_path(output.metrics)


def write_per_image(rows: list[dict], path: str | Path) -> Path:
    """Write `rows` atomically (`store/atomic.py`: temp file, then rename) to `path`; `path`.

    Args:
        rows: `per_image_rows` of the job's models.
        path: the per-image file (`per_image_output`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(pa.Table.from_pylist(rows, schema=PER_IMAGE_SCHEMA), path)
    return path
