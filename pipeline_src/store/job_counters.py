"""A job's own work counters: images through its model and the model's FLOPs, for the report's
efficiency table (`reports/efficiency.py`).

A model loop wraps each batch in `counting(phase, images, device)`. Every call adds the batch's
images to the phase; the first call of a phase in the job runs under a FLOP counter
(`job/counters.flop_counter`: torch's FLOP formulas for matmuls, convolutions and attention, forward
and backward as they run: nothing is counted by hand) and gives the phase's FLOPs per image. The FLOPs of a batch do not depend on
which images it holds, only on their number, so one batch measures them. `execute.py` writes the
counters after the step, beside the job's log: `<log stem>.counters.parquet`, one row.

Counting observes the ops without changing them: the results are bit-identical with and without.
"""
from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline_src.job.counters import (  # noqa: F401  (re-exported: the job-time API)
    _DEVICE,
    LOGGED,
    PHASES,
    Phase,
    count_flops,
    counted,
    counting,
    flop_counter,
    main_math,
    note_logged_images,
    reset,
)
from pipeline_src.store.atomic import write_parquet

if TYPE_CHECKING:
    pass

COUNTERS_SCHEMA = pa.schema([
    ("rule", pa.string()),
    ("images", pa.int64()),  # images (or feature rows) through the model, every epoch counted
    ("flops", pa.float64()),  # counted model FLOPs of those images; null: no phase was measured
    ("flop_images", pa.int64()),  # images whose FLOPs are in `flops`
    ("phases", pa.string()),  # JSON {phase: {images, flops_per_image}}
    ("device", pa.string()),  # cpu, cuda
    ("math", pa.string()),  # the math mode of most counted FLOPs (job/math_mode.py: bfloat16, tf32, float32, ...)
    ("device_name", pa.string()),  # CPU model or GPU name
    ("threads", pa.int32()),  # torch's intra-op threads in the job
    ("step_wall_s", pa.float64()),  # the step's own wall time (Snakemake's benchmark adds start-up)
    ("created_at", pa.timestamp("us", tz="UTC")),
])


def device_name(device: str) -> str:
    """The CPU's model name, or the GPU's name."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def counters_path(log: str | Path) -> Path:
    """Where a job's counters go: beside its log, `<log stem>.counters.parquet`."""
    log = Path(log)
    return log.with_name(log.name.removesuffix(".log") + ".counters.parquet")


def write_counters(log: str | Path, rule: str, step_wall_s: float) -> Path:
    """Write this job's counters beside its log (one row; `COUNTERS_SCHEMA`)."""
    torch = sys.modules.get("torch")  # not imported here: a step without torch computed on one thread
    images = sum(p.images for p in PHASES.values()) or LOGGED["images"]
    measured = [p for p in PHASES.values() if p.flops_per_image is not None]
    device = _DEVICE.get("device", "cpu")
    row = {
        "rule": rule, "images": images,
        "flops": sum(p.images * p.flops_per_image for p in measured) if measured else None,
        "flop_images": sum(p.images for p in measured),
        "phases": json.dumps({k: {"images": p.images, "flops_per_image": p.flops_per_image, "math": p.math}
                              for k, p in sorted(PHASES.items())}),
        "device": device, "math": main_math({p.math: p.images * p.flops_per_image for p in measured if p.math}), "device_name": device_name(device), "threads": torch.get_num_threads() if torch is not None else 1,
        "step_wall_s": step_wall_s, "created_at": datetime.now(timezone.utc),
    }
    path = counters_path(log)
    write_parquet(pa.Table.from_pylist([row], schema=COUNTERS_SCHEMA), path)
    return path
