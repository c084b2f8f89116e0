"""A job's own work counters, kept in the job's process: images through its model and the model's
FLOPs (`reports/efficiency.py` reads what `store/job_counters.py` writes from them).

A model loop wraps each batch in `counting(phase, images, device)`. Every call adds the batch's
images to the phase; the first call of a phase in the job runs under PyTorch's
`FlopCounterMode` (matmuls, convolutions and attention, forward and backward as they run: nothing
is counted by hand) and gives the phase's FLOPs per image. The FLOPs of a batch do not depend on
which images it holds, only on their number, so one batch measures them. The same pass notes the
math mode each counted product ran in (`job/math_mode.py`: its operands' dtype as dispatched, after
autocast, and TF32's permission), so the efficiency table sets the job against that mode's peak.

Counting observes the ops without changing them: the results are bit-identical with and without.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch


@dataclass
class Phase:
    images: int = 0
    flops_per_image: float | None = None
    math: str | None = None  # the math mode carrying most of the phase's counted FLOPs


PHASES: dict[str, Phase] = {}
_DEVICE: dict[str, str] = {}
# Images of the job's progress lines (`data/throughput.py`): the job's images when no model loop
# counts them itself (e.g. `features`), with no FLOPs.
LOGGED: dict[str, int] = {"images": 0}
# Bytes autograd saved for backward in the job's first training batch, and its size
# (`job/training_memory.py`; None: not measured).
ACTIVATIONS: dict[str, int | None] = {"bytes": None, "batch": None}


def reset() -> None:
    """Forget the counts (a new job in this process)."""
    PHASES.clear()
    _DEVICE.clear()
    LOGGED["images"] = 0
    ACTIVATIONS.update(bytes=None, batch=None)


def note_logged_images(n: int) -> None:
    """Images a progress line reported (used only if no `counting` phase counted any)."""
    LOGGED["images"] += n


def flop_counter():
    """`FlopCounterMode` that also counts the CPU's fused attention kernels: torch registers its
    SDPA formulas for the CUDA kernels only, so the same formulas are mapped onto the CPU ops."""
    import torch
    from torch.utils.flop_counter import flop_registry

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
    return _math_counter_class()(display=False, custom_mapping=cpu)


_MATH_COUNTER: list[type] = []


def _math_counter_class() -> type:
    """`FlopCounterMode` that also sums each counted op's FLOPs by its math mode (`flops_by_math`).

    The dispatch mode sees the operands autocast has already cast, so a bfloat16-autocast matmul
    counts as bfloat16. Built on first use: this module imports no torch at import time."""
    if _MATH_COUNTER:
        return _MATH_COUNTER[0]
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline_src.job.math_mode import math_mode, tf32_enabled

    class MathFlopCounter(FlopCounterMode):
        def __enter__(self):
            self.flops_by_math: dict[str, int] = {}
            self._tf32 = tf32_enabled()
            return super().__enter__()

        def _count_flops(self, func_packet, out, args, kwargs):
            if func_packet in self.flop_registry:
                first = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
                if first is not None:
                    mode = math_mode(first.device.type, str(first.dtype).removeprefix("torch."), self._tf32)
                    flops = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
                    self.flops_by_math[mode] = self.flops_by_math.get(mode, 0) + flops
            return super()._count_flops(func_packet, out, args, kwargs)

    _MATH_COUNTER.append(MathFlopCounter)
    return MathFlopCounter


def main_math(flops_by_math: dict[str, float]) -> str | None:
    """The math mode carrying the most FLOPs (None: nothing counted)."""
    return max(flops_by_math, key=flops_by_math.get) if flops_by_math else None


def count_flops(fn, *args, **kwargs) -> tuple[object, int]:
    """Run `fn(*args, **kwargs)` under the FLOP counter; return its result and the FLOPs."""
    with flop_counter() as counter:
        out = fn(*args, **kwargs)
    return out, int(counter.get_total_flops())


@contextmanager
def counting(phase: str, images: int, device: torch.device | str | None = None,
             memory: bool = False) -> Iterator[None]:
    """Count a batch of `images` under `phase`; the phase's first batch also counts its FLOPs.

    Args:
        phase: what the model does (`train`: forward, backward and update; `eval`: forward).
        images: images (or feature rows) in the batch.
        device: where the model runs (recorded with the counters).
        memory: the first batch also measures the activations autograd saves (`job/training_memory.py`;
            plain autograd loops only: torch.func transforms and Opacus' hooks are left alone).
    """
    p = PHASES.setdefault(phase, Phase())
    if device is not None and "device" not in _DEVICE:
        _DEVICE["device"] = str(device).split(":")[0]
    if p.flops_per_image is None and images > 0:
        # the first training batch also measures the activations it saves (training memory, Table 7)
        with flop_counter() as counter, measure_first_batch(images if memory else 0):
            yield
        p.flops_per_image = counter.get_total_flops() / images
        p.math = main_math(counter.flops_by_math)
    else:
        yield
    p.images += images


def counted(phase: str, fn, device: torch.device | str | None = None):
    """`fn` (a batch → output) with each call counted under `phase` (`counting`)."""
    def call(x):
        with counting(phase, len(x), device):
            return fn(x)
    return call


@contextmanager
def saved_activation_bytes() -> Iterator[list[int]]:
    """Sum the bytes autograd saves for backward inside the block (a one-item list, filled as it runs).

    Parameters and views of parameters are weights, not activations: left out. A storage saved by
    several ops counts once.
    """
    import torch
    from torch import nn

    seen: set[int] = set()
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if not isinstance(base, nn.Parameter):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


def measure_first_batch(images: int):
    """A context for one training batch: measures its saved activations if no batch of this job has."""
    if ACTIVATIONS["bytes"] is not None or images <= 0:
        return _nothing()
    return _measure(images)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _measure(images: int) -> Iterator[None]:
    with saved_activation_bytes() as total:
        yield
    ACTIVATIONS.update(bytes=total[0], batch=images)
