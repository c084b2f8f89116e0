"""A job's own work counters, kept in the job's process: images through its model and the model's
FLOPs (`reports/efficiency.py` reads what `store/job_counters.py` writes from them).

A model loop wraps each batch in `counting(phase, images, device)`. Every call adds the batch's
images to the phase; the first call of a phase in the job runs under a FLOP counter (torch's
FLOP formulas for matmuls, convolutions and attention, forward and backward as they run: nothing
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
    """A FLOP counter (`get_total_flops()`, `flops_by_math`) with torch's FLOP formulas
    (`torch.utils.flop_counter.flop_registry`), which also counts the CPU's fused attention
    kernels: torch registers its SDPA formulas for the CUDA kernels only, so the same formulas are
    mapped onto the CPU ops."""
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    cpu = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        cpu[aten._scaled_dot_product_flash_attention_for_cpu] = flop_registry[aten._scaled_dot_product_flash_attention]
        cpu[aten._scaled_dot_product_flash_attention_for_cpu_backward] = flop_registry[
            aten._scaled_dot_product_efficient_attention_backward]
    return _counter_class()({**flop_registry, **cpu})


_COUNTER: list[type] = []


def _counter_class() -> type:
    """A dispatch mode that runs every op as it is and sums the FLOPs of those the registry knows,
    in total, by math mode (`flops_by_math`) and by op (`flops_by_op`).

    Why not torch's `FlopCounterMode`, which sums the same formulas: it also attributes every op to
    the modules it runs in (global module hooks, a tree of counts), which this job's counters never
    read; that doubled the first batch's overhead (a train step of the default study's ViT:
    12 ms plain, 77 ms under FlopCounterMode, 44 ms under this mode). `tests/job/test_flop_counter.py`
    checks the totals equal FlopCounterMode's on the jobs' model paths.

    The dispatch mode sees the operands autocast has already cast, so a bfloat16-autocast matmul
    counts as bfloat16. Built on first use: this module imports no torch at import time."""
    if _COUNTER:
        return _COUNTER[0]
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from pipeline_src.job.math_mode import math_mode, tf32_enabled

    class FlopCounter(TorchDispatchMode):
        def __init__(self, flop_registry: dict) -> None:
            super().__init__()
            self.flop_registry = flop_registry
            self.total = 0
            self.flops_by_math: dict[str, int] = {}
            self.flops_by_op: dict[str, int] = {}  # by aten op packet, e.g. "aten.mm"

        def __enter__(self):
            self.total, self.flops_by_math, self.flops_by_op, self._tf32 = 0, {}, {}, tf32_enabled()
            return super().__enter__()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = self.flop_registry.get(func._overloadpacket)
            if formula is not None:
                first = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
                if first is not None:
                    flops = formula(*args, **kwargs, out_val=out)
                    mode = math_mode(first.device.type, str(first.dtype).removeprefix("torch."), self._tf32)
                    self.flops_by_math[mode] = self.flops_by_math.get(mode, 0) + flops
                    op = str(func._overloadpacket)
                    self.flops_by_op[op] = self.flops_by_op.get(op, 0) + flops
                    self.total += flops
            return out

        def get_total_flops(self) -> int:
            return self.total

    _COUNTER.append(FlopCounter)
    return FlopCounter


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
