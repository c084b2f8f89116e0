"""The machine's measured GEMM peak in a given math mode: a short matmul probe (well under 2 s).

The efficiency table (`reports/efficiency.py`) sets each rule's achieved model FLOP/s against it,
in the math mode the rule's jobs computed in (`job/math_mode.py`: bfloat16 or float16 tensor
cores, TF32, IEEE float32, float64): a float32 probe against a bfloat16 job would overstate its
efficiency by the ratio of the two peaks (about 15x on an H200). The probe times square matmuls of
`size` (1024 on the CPU: 2.1 GFLOP each; 4096 on a GPU) for about `budget_s` and keeps the
fastest, at a given number of torch threads (a CPU job's FLOP/s is bounded by the threads it was given).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class GemmPeak:
    device: str  # cpu, cuda
    device_name: str
    threads: int
    flops_per_s: float  # the fastest matmul's 2·n³ / seconds
    size: int
    seconds: float  # how long the probe ran
    math: str = "float32"  # the math mode timed (job/math_mode.py MODES)


def measure_gemm_peak(device: str = "cpu", threads: int | None = None, size: int | None = None,
                      budget_s: float = 0.4, math: str = "float32") -> GemmPeak:
    """Time (size × size) @ (size × size) in math mode `math` for about `budget_s` seconds; keep the fastest.

    Args:
        device: `cpu` or `cuda`.
        threads: torch intra-op threads during the probe (CPU); None: the current setting.
        size: the matrices' side; None: 1024 on the CPU, 4096 on a GPU.
        budget_s: the probe's time budget (at least two products run: one warm-up, one timed).
        math: the math mode (`job/math_mode.py`): bfloat16, float16, tf32 (float32 operands with TF32
            allowed; CUDA), float32 (TF32 forbidden during the probe on CUDA) or float64.
    """
    import torch

    from pipeline_src.job.math_mode import float32_matmul_tf32, probe_dtype
    from pipeline_src.store.job_counters import device_name

    dtype, tf32 = probe_dtype(math)
    if tf32 and device != "cuda":
        raise ValueError(f"math mode 'tf32' is a CUDA mode (device {device!r})")

    size = size or (4096 if device == "cuda" else 1024)
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        with float32_matmul_tf32(tf32) if device == "cuda" else contextlib.nullcontext():
            start = time.perf_counter()
            size = _fitting_size(size, budget_s, device, getattr(torch, dtype), sync)
            gen = torch.Generator(device=device).manual_seed(0)
            a = torch.randn(size, size, device=device, generator=gen).to(getattr(torch, dtype))
            b = torch.randn(size, size, device=device, generator=gen).to(getattr(torch, dtype))
            a @ b  # warm-up: thread pool and kernel selection
            sync()
            best = float("inf")
            while True:
                t = time.perf_counter()
                a @ b
                sync()
                best = min(best, time.perf_counter() - t)
                if time.perf_counter() - start > budget_s:
                    break
        return GemmPeak(device, device_name(device), torch.get_num_threads(), 2 * size**3 / best, size,
                        time.perf_counter() - start, math)
    finally:
        torch.set_num_threads(old)


def _fitting_size(size: int, budget_s: float, device: str, dtype, sync) -> int:
    """The side the probe times: `size`, or the last of 128, 256, ... before it whose product took
    more than an eighth of the budget (the next, 8x the work, would take the whole budget). A mode without
    fast kernels here (bfloat16 on a CPU without AVX-512 BF16: one 1024² product took 12 s on this
    2-core AMD EPYC, float32's took 0.2 s) stays small; these products also warm the kernels up."""
    import torch

    side = 128
    while True:
        x = torch.ones(side, side, device=device, dtype=dtype)
        t = time.perf_counter()
        x @ x
        sync()
        if side >= size or time.perf_counter() - t > budget_s / 8:
            return min(side, size)
        side *= 2
