"""Benchmark helpers: repeated timing with medians, peak memory, and Parquet rows.

Benchmarks live in `benchmarks/`; each writes rows with `BENCHMARK_SCHEMA` to
`results/benchmarks/<name>.parquet` so DuckDB can read them beside the metrics.
"""
from __future__ import annotations

import gc
import json
import math
import platform
import re
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import pyarrow as pa

from pipeline_src.job.glibc_malloc import glibc, set_mmap_threshold
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
    ("peak_mem_mb", pa.float64()),   # CUDA max allocated, or CPU peak RSS growth; NULL: not measured
    ("repeats", pa.int64()),
    ("commit", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("environment", pa.string()),    # JSON fingerprint: python, torch, cuda, cudnn, timm, ... (pipeline_src/plan/environment.py)
    ("peak_mem_method", pa.string()),  # how peak_mem_mb was measured, or "not measured: <why>"
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


_MMAP_THRESHOLD = 128 * 1024


def pin_mmap_threshold() -> None:
    """Make every allocation ≥ 128 KiB its own mapping, returned to the OS on free, so RSS
    follows tensor frees at once (glibc's adaptive threshold otherwise keeps freed tensors in
    the heap, where the next case reuses them without RSS growth). Idempotent; `cpu_peak_rss_mb`
    calls it. It stays pinned, and every large tensor then costs a fresh mapping and its page
    faults: a TAFT train step took ~1.5x the CPU time pinned. So take times before the first CPU
    peak measurement (or in another process), never after pinning."""
    if not set_mmap_threshold(_MMAP_THRESHOLD):
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed; CPU peak memory needs glibc")


def cpu_peak_rss_mb(fn: Callable[[], Any]) -> float:
    """Peak RSS growth of one `fn()` call in MiB (Linux, glibc).

    Pins glibc's mmap threshold (`pin_mmap_threshold`) and returns freed heap pages to the
    OS (`malloc_trim(0)`), so memory that `fn` reuses from earlier frees counts as growth;
    then resets VmHWM to the current RSS through /proc/self/clear_refs ("5") and returns
    VmHWM after the call minus VmRSS before. Everything resident before the call (model,
    data, optimizer state) is excluded; what `fn` allocates and touches, even briefly, is in.

    Args:
        fn: the case, called once.
    """
    clear_refs = Path("/proc/self/clear_refs")
    if not clear_refs.exists():
        raise RuntimeError("CPU peak memory needs Linux /proc/self/clear_refs (VmHWM reset)")
    pin_mmap_threshold()
    gc.collect()
    glibc().malloc_trim(0)
    clear_refs.write_text("5")  # reset VmHWM to the current RSS
    base = _proc_status_mb("VmRSS")
    fn()
    return _proc_status_mb("VmHWM") - base


def peak_memory_mb(fn: Callable[[], Any], device: str = "cpu") -> float:
    """Peak memory growth of one `fn()` call in MiB: on CUDA `torch.cuda.max_memory_allocated`
    above the allocated baseline; on the CPU the peak RSS growth (`cpu_peak_rss_mb`).

    Args:
        fn: the case, called once.
        device: where `fn` runs.
    """
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
    return cpu_peak_rss_mb(fn)


PEAKS_MARK = "BENCHMARK_PEAKS "


def emit_peaks(peaks: dict[str, float]) -> None:
    """Print per-case peaks (MiB) on one marked stdout line, for `peaks_from_subprocess`."""
    print(PEAKS_MARK + json.dumps(peaks), flush=True)


def peaks_from_subprocess(cmd: list[str], timeout_s: float = 3600) -> dict[str, float]:
    """Run `cmd` (a benchmark in a peaks-only mode that pins the mmap threshold first thing,
    builds its cases and calls `emit_peaks`) and return its peaks. Keeps the pinned allocator,
    which slows allocation, out of the process that takes the times.

    Args:
        cmd: the command line, e.g. [sys.executable, script, ..., "--peaks-only"].
        timeout_s: wall-clock limit.
    """
    import subprocess

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(PEAKS_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"peaks subprocess {cmd} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len(PEAKS_MARK):])


def peak_method(device: str) -> str:
    """What `peak_memory_mb` measures on `device` (recorded in each row's `peak_mem_method`)."""
    import torch

    if torch.device(device).type == "cuda":
        return "cuda max_memory_allocated growth"
    return "cpu peak RSS growth (VmHWM reset, mmap threshold pinned)"


def benchmark_row(benchmark: str, case: str, device: str, sizes: dict, times: list[float],
                  peak_mb: Optional[float], *, method: Optional[str] = None,
                  not_measured: Optional[str] = None) -> dict:
    """One row of `BENCHMARK_SCHEMA`.

    A claimed peak must be a finite number > 0 (a zero, negative or NaN peak raises: it is a
    measuring error, not a figure). A case without a memory meaning passes `peak_mb=None` with
    `not_measured` saying why; the row then has a NULL peak and says so in `peak_mem_method`.

    Args:
        benchmark, case: names of the script and of what was measured.
        device: where it ran.
        sizes: JSON-able sizes.
        times: per-repeat times in ms.
        peak_mb: peak memory in MiB, or None (see `not_measured`).
        method: how the peak was measured (default: `peak_method(device)`, i.e. `peak_memory_mb`).
        not_measured: the reason there is no peak; required exactly when `peak_mb` is None.
    """
    where = f"benchmark_row({benchmark!r}, case {case!r})"
    if peak_mb is None:
        if not not_measured:
            raise ValueError(f"{where}: peak_mb=None needs not_measured='<why this case has no memory figure>'")
        peak, how = None, f"not measured: {not_measured}"
    else:
        if not_measured:
            raise ValueError(f"{where}: a peak ({peak_mb}) and not_measured={not_measured!r} both given")
        peak = float(peak_mb)
        if not math.isfinite(peak) or peak <= 0.0:
            raise ValueError(f"{where}: peak memory {peak} MB is not a measurement (zero, negative or NaN); "
                             "measure it with peak_memory_mb or pass peak_mb=None with not_measured=...")
        how = method or peak_method(device)
    if not times:
        raise ValueError(f"{where}: no times")
    return {
        "benchmark": benchmark,
        "case": case,
        "device": device_name(device),
        "sizes": json.dumps(sizes, sort_keys=True),
        "time_ms_median": statistics.median(times),
        "time_ms_all": list(times),
        "peak_mem_mb": peak,
        "peak_mem_method": how,
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
