"""Benchmark helpers: repeated timing with medians, peak memory, and Parquet rows.

Benchmarks live in `benchmarks/`; each writes rows with `BENCHMARK_SCHEMA` to
`results/benchmarks/<name>.parquet` so DuckDB can read them beside the metrics.
"""
from __future__ import annotations

import ctypes
import gc
import json
import platform
import re
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from pipeline_src.plan.environment import fingerprint_json
from pipeline_src.store.atomic import write_parquet
from pipeline_src.store.provenance import git_commit

BENCHMARK_SCHEMA = pa.schema([
    ("benchmark", pa.string()),      # script name, e.g. "taft_forward"
    ("case", pa.string()),           # what was measured, e.g. "tangent_forward"
    ("device", pa.string()),         # "cpu: <model>" or "cuda: <gpu name>"
    ("sizes", pa.string()),          # JSON object of the sizes (batch, embed, depth, ...)
    ("time_ms_median", pa.float64()),
    ("time_ms_all", pa.list_(pa.float64())),
    ("peak_mem_mb", pa.float64()),   # CUDA max allocated, or CPU peak RSS growth
    ("repeats", pa.int64()),
    ("commit", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("environment", pa.string()),    # JSON fingerprint: python, torch, cuda, cudnn, timm, ... (pipeline_src/plan/environment.py)
])


def device_name(device: "str | Any") -> str:
    """Human-readable device string recorded with every row."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    return f"cpu: {platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"


def time_median(fn: Callable[[], Any], repeats: int = 7, warmup: int = 2, device: str = "cpu") -> tuple[float, list[float]]:
    """Median wall time of `fn()` in milliseconds over `repeats` runs after `warmup` runs."""
    import torch

    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times


def _proc_status_mb(key: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) / 1024


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def pin_mmap_threshold() -> None:
    """Make every allocation ≥ 128 KiB its own mapping, returned to the OS on free, so RSS
    follows tensor frees at once (glibc's adaptive threshold otherwise keeps freed tensors in
    the heap). Call once, before allocating, in any CPU benchmark that reports peak memory."""
    ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 128 * 1024)


def peak_memory_mb(fn: Callable[[], Any], device: str = "cpu") -> float:
    """Peak memory growth of one `fn()` call in MiB: CUDA max allocated above the baseline on a
    GPU; on the CPU (Linux) the peak RSS growth, from VmHWM after resetting it through
    /proc/self/clear_refs, minus VmRSS before (see `pin_mmap_threshold`)."""
    import torch

    gc.collect()
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        fn()
        torch.cuda.synchronize(dev)
        return (torch.cuda.max_memory_allocated(dev) - base) / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _proc_status_mb("VmRSS")
    fn()
    return _proc_status_mb("VmHWM") - base


def benchmark_row(benchmark: str, case: str, device: str, sizes: dict, times: list[float], peak_mb: float) -> dict:
    """One row of `BENCHMARK_SCHEMA`."""
    return {
        "benchmark": benchmark,
        "case": case,
        "device": device_name(device),
        "sizes": json.dumps(sizes, sort_keys=True),
        "time_ms_median": statistics.median(times),
        "time_ms_all": list(times),
        "peak_mem_mb": float(peak_mb),
        "repeats": len(times),
        "commit": git_commit(),
        "created_at": datetime.now(timezone.utc),
        "environment": fingerprint_json(),
    }


def write_benchmark_rows(name: str, rows: list[dict], out_dir: str | Path = "results/benchmarks") -> Path:
    """Write rows atomically to `<out_dir>/<name>.parquet` and return the path."""
    path = Path(out_dir) / f"{name}.parquet"
    write_parquet(pa.Table.from_pylist(rows, schema=BENCHMARK_SCHEMA), path)
    return path
