"""A job's own work counters: images through its model and the model's FLOPs, for the report's
efficiency table (`reports/efficiency.py`).

A model loop wraps each batch in `counting(phase, images, device)`. Every call adds the batch's
images to the phase; the first call of a phase in the job runs under PyTorch's
`FlopCounterMode` (matmuls, convolutions and attention, forward and backward as they run: nothing
is counted by hand) and gives the phase's FLOPs per image. The FLOPs of a batch do not depend on
which images it holds, only on their number, so one batch measures them. `execute.py` writes the
counters after the step, beside the job's log: `<log stem>.counters.parquet`, one row.

Counting observes the ops without changing them: the results are bit-identical with and without.
"""
from __future__ import annotations

import json
import platform
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pyarrow as pa

from pipeline_src.store.atomic import write_parquet

if TYPE_CHECKING:
    import torch

COUNTERS_SCHEMA = pa.schema([
    ("rule", pa.string()),
    ("images", pa.int64()),  # images (or feature rows) through the model, every epoch counted
    ("flops", pa.float64()),  # counted model FLOPs of those images; null: no phase was measured
    ("flop_images", pa.int64()),  # images whose FLOPs are in `flops`
    ("phases", pa.string()),  # JSON {phase: {images, flops_per_image}}
    ("device", pa.string()),  # cpu, cuda
    ("device_name", pa.string()),  # CPU model or GPU name
    ("threads", pa.int32()),  # torch's intra-op threads in the job
    ("step_wall_s", pa.float64()),  # the step's own wall time (Snakemake's benchmark adds start-up)
    ("created_at", pa.timestamp("us", tz="UTC")),
])


@dataclass
class Phase:
    images: int = 0
    flops_per_image: float | None = None


PHASES: dict[str, Phase] = {}
_DEVICE: dict[str, str] = {}
# Images of the job's progress lines (`data/throughput.py`): the job's images when no model loop
# counts them itself (e.g. `features`), with no FLOPs.
LOGGED: dict[str, int] = {"images": 0}


def reset() -> None:
    """Forget the counts (a new job in this process)."""
    PHASES.clear()
    _DEVICE.clear()
    LOGGED["images"] = 0


def note_logged_images(n: int) -> None:
    """Images a progress line reported (used only if no `counting` phase counted any)."""
    LOGGED["images"] += n


def flop_counter():
    """`FlopCounterMode` that also counts the CPU's fused attention kernels: torch registers its
    SDPA formulas for the CUDA kernels only, so the same formulas are mapped onto the CPU ops."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    aten = torch.ops.aten

    def raw(formula):  # the registry's entries already take (args, out_val)
        def f(*args, **kwargs):
            return formula(*args, **kwargs)
        f._get_raw = True
        return f

    cpu = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        cpu[aten._scaled_dot_product_flash_attention_for_cpu] = raw(flop_registry[aten._scaled_dot_product_flash_attention])
        cpu[aten._scaled_dot_product_flash_attention_for_cpu_backward] = raw(
            flop_registry[aten._scaled_dot_product_efficient_attention_backward])
    return FlopCounterMode(display=False, custom_mapping=cpu)


def count_flops(fn, *args, **kwargs) -> tuple[object, int]:
    """Run `fn(*args, **kwargs)` under the FLOP counter; return its result and the FLOPs."""
    with flop_counter() as counter:
        out = fn(*args, **kwargs)
    return out, int(counter.get_total_flops())


@contextmanager
def counting(phase: str, images: int, device: torch.device | str | None = None) -> Iterator[None]:
    """Count a batch of `images` under `phase`; the phase's first batch also counts its FLOPs.

    Args:
        phase: what the model does (`train`: forward, backward and update; `eval`: forward).
        images: images (or feature rows) in the batch.
        device: where the model runs (recorded with the counters).
    """
    p = PHASES.setdefault(phase, Phase())
    if device is not None and "device" not in _DEVICE:
        _DEVICE["device"] = str(device).split(":")[0]
    if p.flops_per_image is None and images > 0:
        with flop_counter() as counter:
            yield
        p.flops_per_image = counter.get_total_flops() / images
    else:
        yield
    p.images += images


def counted(phase: str, fn, device: torch.device | str | None = None):
    """`fn` (a batch → output) with each call counted under `phase` (`counting`)."""
    def call(x):
        with counting(phase, len(x), device):
            return fn(x)
    return call


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
    import torch

    images = sum(p.images for p in PHASES.values()) or LOGGED["images"]
    measured = [p for p in PHASES.values() if p.flops_per_image is not None]
    device = _DEVICE.get("device", "cpu")
    row = {
        "rule": rule, "images": images,
        "flops": sum(p.images * p.flops_per_image for p in measured) if measured else None,
        "flop_images": sum(p.images for p in measured),
        "phases": json.dumps({k: {"images": p.images, "flops_per_image": p.flops_per_image}
                              for k, p in sorted(PHASES.items())}),
        "device": device, "device_name": device_name(device), "threads": torch.get_num_threads(),
        "step_wall_s": step_wall_s, "created_at": datetime.now(timezone.utc),
    }
    path = counters_path(log)
    write_parquet(pa.Table.from_pylist([row], schema=COUNTERS_SCHEMA), path)
    return path
