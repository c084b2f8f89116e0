"""Benchmark rows: the peak-memory helper measures known allocations, and a row refuses a
peak that is no measurement (zero, negative, NaN)."""
from __future__ import annotations

import math
import sys

import pyarrow.parquet as pq
import pytest
import torch

from pipeline_src.store.benchmark_rows import (
    benchmark_row,
    peak_memory_mb,
    peaks_from_subprocess,
    write_benchmark_rows,
)
from tests.conftest import REPO

MIB = 2**20


def _alloc(mib: int) -> torch.Tensor:
    return torch.ones(mib * MIB // 4, dtype=torch.float32)  # touched pages, not just reserved


def test_cpu_peak_of_a_known_200_mib_tensor():
    peaks = [peak_memory_mb(lambda: _alloc(200), "cpu") for _ in range(3)]
    # Every call, not only the first: freed tensors must not hide in glibc's heap.
    for peak in peaks:
        assert 0.85 * 200 <= peak <= 1.15 * 200, peaks


def test_cpu_peak_counts_memory_reused_from_earlier_frees():
    # Free a large heap-held buffer first (many small tensors, below the mmap threshold), then
    # allocate the same amount again inside the measured call: it must count as growth.
    small = [torch.ones(16 * 1024) for _ in range(3200)]  # 64 KiB each, 200 MiB in all
    del small

    def again() -> list[torch.Tensor]:
        return [torch.ones(16 * 1024) for _ in range(3200)]

    peak = peak_memory_mb(again, "cpu")
    assert 0.85 * 200 <= peak <= 1.15 * 200, peak


def test_cpu_peak_is_the_peak_not_the_end_state():
    def transient() -> None:
        a = _alloc(100)
        b = _alloc(100)  # 200 MiB live here
        del a, b
        _alloc(50)

    peak = peak_memory_mb(transient, "cpu")
    assert 0.85 * 200 <= peak <= 1.15 * 200, peak


CHILD = """
import sys, torch
sys.path.insert(0, {repo!r})
from pipeline_src.store.benchmark_rows import emit_peaks, peak_memory_mb, pin_mmap_threshold
pin_mmap_threshold()
emit_peaks({{"ones_120": peak_memory_mb(lambda: torch.ones(120 * 2**20 // 4)), "none": 1.5}})
"""


def test_peaks_from_a_child_process():
    peaks = peaks_from_subprocess([sys.executable, "-c", CHILD.format(repo=str(REPO))], timeout_s=300)
    assert set(peaks) == {"ones_120", "none"}
    assert 0.85 * 120 <= peaks["ones_120"] <= 1.15 * 120, peaks
    with pytest.raises(RuntimeError, match="exit 3"):
        peaks_from_subprocess([sys.executable, "-c", "import sys; sys.exit(3)"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_of_a_known_200_mib_tensor():
    peak = peak_memory_mb(lambda: torch.ones(200 * MIB // 4, device="cuda"), "cuda")
    assert 0.85 * 200 <= peak <= 1.15 * 200, peak


@pytest.mark.parametrize("bad", [0.0, -0.2, float("nan"), float("inf")])
def test_a_row_with_a_peak_that_is_no_measurement_raises(bad):
    with pytest.raises(ValueError, match="case 'tangent_forward'.*not a measurement"):
        benchmark_row("bench_x", "tangent_forward", "cpu", {"batch": 1}, [1.0], bad)


def test_not_measured_needs_a_reason_and_says_so_in_the_row(tmp_path):
    with pytest.raises(ValueError, match="not_measured"):
        benchmark_row("bench_x", "scipy_assignment", "cpu", {}, [1.0], None)
    with pytest.raises(ValueError, match="both given"):
        benchmark_row("bench_x", "c", "cpu", {}, [1.0], 5.0, not_measured="why")
    row = benchmark_row("bench_x", "scipy_assignment", "cpu", {}, [1.0, 3.0], None,
                        not_measured="a reference solver called on prepared arrays")
    measured = benchmark_row("bench_x", "match", "cpu", {}, [2.0], 12.5)
    path = write_benchmark_rows("bench_x", [row, measured], tmp_path)
    got = pq.read_table(path).select(["case", "peak_mem_mb", "peak_mem_method", "time_ms_median"]).to_pylist()
    assert got[0] == {"case": "scipy_assignment", "peak_mem_mb": None, "time_ms_median": 2.0,
                      "peak_mem_method": "not measured: a reference solver called on prepared arrays"}
    assert got[1]["peak_mem_mb"] == 12.5 and got[1]["peak_mem_method"].startswith("cpu peak RSS growth")
    assert not math.isnan(got[1]["time_ms_median"])
