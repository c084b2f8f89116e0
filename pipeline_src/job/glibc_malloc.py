"""glibc's malloc settings that decide whether freed tensors leave a process's RSS.

glibc serves an allocation below its mmap threshold from the heap, and raises that threshold
(up to 32 MiB) each time a larger mapped block is freed. After a few training steps every
batch-sized tensor then comes from the heap, and freed ones stay resident there: a job's peak
RSS grows with its number of steps, not with what it holds. Pinning the threshold turns the
adaptation off, so tensors at or above it are their own mappings, returned to the OS on free.
"""
from __future__ import annotations

import ctypes
import time
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
TRIM_INTERVAL_S = 0.05  # `release_freed`'s least interval between trims
_last_trim = [float("-inf")]  # monotonic time of this process's last trim
_libc: Any = None


def glibc() -> Any:
    """The C library, when it is glibc (it has `mallopt` and `malloc_trim`); else RuntimeError."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.mallopt, _libc.malloc_trim  # noqa: B018 (both must exist: glibc)
        except (OSError, AttributeError) as e:
            raise RuntimeError(f"needs Linux with glibc (libc.so.6: {e})") from e
    return _libc


def set_mmap_threshold(num_bytes: int) -> bool:
    """Pin glibc's mmap threshold at `num_bytes` (no adaptation). False when not glibc or refused."""
    try:
        return glibc().mallopt(M_MMAP_THRESHOLD, int(num_bytes)) == 1
    except RuntimeError:
        return False


def release_freed(min_interval_s: float = TRIM_INTERVAL_S) -> None:
    """Hand the heap's free pages back to the OS (glibc `malloc_trim(0)`; nothing elsewhere), at most
    once per `min_interval_s` of the process's wall time.

    Batch tensors below the pinned mmap threshold come from the heap; freed, they stay resident
    and the heap fragments, so a loop's RSS creeps up with its number of batches (the fusion
    step: +21 MB from 100 to 400 images). Called once per batch by the evaluation, statistics and
    DP loops, it keeps them flat; a 64 KiB threshold did the same but made every such tensor its
    own mapping (fuse and train_private 1.3-1.7x slower, measured). A trim walks the whole heap
    (about 1.5 ms in a job of the default study), so it runs at most every `min_interval_s`: what
    stays resident between two trims is the work of that interval, whatever the number of batches.

    Args:
        min_interval_s: skip the trim when the last one was more recent (0: always trim).
    """
    now = time.monotonic()
    if now - _last_trim[0] < min_interval_s:
        return
    try:
        glibc().malloc_trim(0)
    except RuntimeError:
        pass
    _last_trim[0] = time.monotonic()
