"""The machine's measured GEMM peak: a short float32 matmul probe (well under 2 s).

The efficiency table (`reports/efficiency.py`) sets each rule's achieved model FLOP/s against it.
The probe times square matmuls of `size` (1024 on the CPU: 2.1 GFLOP each; 4096 on a GPU) for
about `budget_s` and keeps the fastest, at a given number of torch threads (a CPU job's FLOP/s
is bounded by the threads it was given).
"""
from __future__ import annotations

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


def measure_gemm_peak(device: str = "cpu", threads: int | None = None, size: int | None = None,
                      budget_s: float = 0.4) -> GemmPeak:
    """Time float32 (size × size) @ (size × size) for about `budget_s` seconds; keep the fastest.

    Args:
        device: `cpu` or `cuda`.
        threads: torch intra-op threads during the probe (CPU); None: the current setting.
        size: the matrices' side; None: 1024 on the CPU, 4096 on a GPU.
        budget_s: the probe's time budget (at least two products run: one warm-up, one timed).
    """
    import torch

    from pipeline_src.store.job_counters import device_name

    size = size or (4096 if device == "cuda" else 1024)
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(size, size, device=device, generator=gen)
        b = torch.randn(size, size, device=device, generator=gen)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        start = time.perf_counter()
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
                        time.perf_counter() - start)
    finally:
        torch.set_num_threads(old)
