"""The metrics table: one Parquet file per job under `results/metrics/`, one row per metric.

Schema version 2 (columns are only ever added, never renamed; readers use
`read_parquet(..., union_by_name=true)`). Version 2 added `environment`; version-1 files read
with it NULL:

| column | type | meaning |
|---|---|---|
| schema_version | int32 | version of this schema |
| experiment | string | `experiment` from the config |
| dataset | string | dataset source (digits, imagefolder) |
| method | string | method variant name from `methods:` (or `pretrain`) |
| kind | string | method kind (fc, nlft, full, ...) |
| model | string | `shard` (one shard model), or a composition: `soup`, `ensemble`, or a study's model name |
| variant | string, null | JSON of the study settings that identify the row further (fusion method, ε, removed shards, ...) |
| shards | int64 | shard count N (1 = the whole training split) |
| shard_id | int64, null | shard of a single shard model; null for compositions |
| seed | int64 | sharding/training seed |
| split | string | evaluation split (test) |
| metric | string | accuracy, loss, ... |
| value | float64 | the value |
| num_samples | int64 | evaluated samples |
| wall_time_s | float64 | wall time of the job's main work |
| peak_mem_mb | float64 | peak memory of the job (CUDA max allocated, or process max RSS) |
| device | string | device the job ran on |
| commit | string | git commit of the code |
| created_at | timestamp[us, UTC] | when the row was written |
| environment | string | JSON fingerprint of the versions that made the row (python, torch, cuda, cudnn, timm, opacus, snakemake, numpy, commit, dirty; `pipeline_src/plan/environment.py`) |
"""
from __future__ import annotations

import resource
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline_src.plan.environment import fingerprint_json
from pipeline_src.store.atomic import write_parquet
from pipeline_src.store.provenance import git_commit

if TYPE_CHECKING:  # the query CLI reads this schema without loading torch
    import torch

SCHEMA_VERSION = 2  # 2: + environment

METRICS_SCHEMA = pa.schema([
    ("schema_version", pa.int32()),
    ("experiment", pa.string()),
    ("dataset", pa.string()),
    ("method", pa.string()),
    ("kind", pa.string()),
    ("model", pa.string()),
    ("variant", pa.string()),
    ("shards", pa.int64()),
    ("shard_id", pa.int64()),
    ("seed", pa.int64()),
    ("split", pa.string()),
    ("metric", pa.string()),
    ("value", pa.float64()),
    ("num_samples", pa.int64()),
    ("wall_time_s", pa.float64()),
    ("peak_mem_mb", pa.float64()),
    ("device", pa.string()),
    ("commit", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("environment", pa.string()),
])


def peak_memory_mb(device: torch.device) -> float:
    """CUDA max allocated on a GPU, else this process's max resident set size."""
    if device.type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def metric_rows(values: dict[str, float], *, context: dict, device: torch.device, wall_time_s: float) -> list[dict]:
    """One row per metric; `context` holds the identifying columns (experiment ... num_samples)."""
    common = {
        "schema_version": SCHEMA_VERSION, "wall_time_s": wall_time_s, "peak_mem_mb": peak_memory_mb(device),
        "device": str(device), "commit": git_commit(), "created_at": datetime.now(timezone.utc),
        "environment": fingerprint_json(), **context,
    }
    return [{**common, "metric": m, "value": float(v)} for m, v in values.items()]


def write_metrics(rows: list[dict], path: str | Path) -> None:
    """Write rows atomically with the explicit schema (missing columns become null)."""
    names = METRICS_SCHEMA.names
    unknown = {k for r in rows for k in r} - set(names)
    if unknown:
        raise ValueError(f"metrics rows have columns outside the schema: {sorted(unknown)}")
    write_parquet(pa.Table.from_pylist(rows, schema=METRICS_SCHEMA), path)
