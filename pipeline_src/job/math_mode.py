"""The math mode a job's matrix products run in, and the settings that reproduce it in a GEMM probe.

A job's efficiency is set against the peak of the arithmetic it uses (`reports/efficiency.py`):
bfloat16 and float16 products run on a GPU's tensor cores, float32 ones on its TF32 tensor cores
when PyTorch allows TF32 for matmuls (`torch.backends.cuda.matmul.fp32_precision = "tf32"`, or
`torch.set_float32_matmul_precision("high" | "medium")`, or the legacy `allow_tf32` flag), in
IEEE float32 otherwise. On the CPU the mode is the dtype itself. The peaks of these modes differ
by up to 16x on one GPU (an H100's dense bf16 against its float32), so a float32 probe overstates a
bf16 job's efficiency that much.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

MODES = ("bfloat16", "float16", "tf32", "float32", "float64")


def math_mode(device: str, dtype: str, tf32: bool) -> str:
    """The math mode of a matrix product on `device` whose operands have `dtype`.

    Args:
        device: `cpu` or `cuda`.
        dtype: the operands' dtype as torch names it without the prefix (`bfloat16`, `float32`, ...).
        tf32: whether PyTorch allows TF32 for float32 matmuls (`tf32_enabled()`); CUDA only.

    Raises:
        ValueError: for a dtype with no floating-point matmul mode (integers, complex).
    """
    if dtype in ("bfloat16", "float16", "float64"):
        return dtype
    if dtype == "float32":
        return "tf32" if device == "cuda" and tf32 else "float32"
    raise ValueError(f"no matmul math mode for dtype {dtype!r} (expected one of bfloat16, float16, float32, float64)")


def tf32_enabled() -> bool:
    """Whether float32 CUDA matmuls may use TF32 now: the per-backend setting where it is set
    (torch >= 2.9), else `set_float32_matmul_precision` and the legacy `allow_tf32` flag."""
    import torch

    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", "none")
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    with warnings.catch_warnings():  # the legacy flag's deprecation notice, where torch has one
        warnings.simplefilter("ignore")
        try:
            return bool(matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
        except RuntimeError:  # legacy and new settings mixed: torch refuses to say; the flag said no
            return False


def probe_dtype(mode: str) -> tuple[str, bool]:
    """The operand dtype and the TF32 permission that make a GEMM probe run in `mode`.

    Args:
        mode: one of `MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown math mode {mode!r} (expected one of {', '.join(MODES)})")
    return ("float32" if mode == "tf32" else mode), mode == "tf32"


@contextmanager
def float32_matmul_tf32(allowed: bool) -> Iterator[None]:
    """Allow (or forbid) TF32 for float32 CUDA matmuls inside the block; the previous setting after it."""
    import torch

    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9: the per-backend setting, no legacy mixing
        old = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if allowed else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = old
        return
    old_flag = matmul.allow_tf32
    matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        matmul.allow_tf32 = old_flag
