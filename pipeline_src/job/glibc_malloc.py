"""glibc's malloc settings that decide whether freed tensors leave a process's RSS.

glibc serves an allocation below its mmap threshold from the heap, and raises that threshold
(up to 32 MiB) each time a larger mapped block is freed. After a few training steps every
batch-sized tensor then comes from the heap, and freed ones stay resident there: a job's peak
RSS grows with its number of steps, not with what it holds. Pinning the threshold turns the
adaptation off, so tensors at or above it are their own mappings, returned to the OS on free.

Pinning it also stops glibc's trim threshold from following it (glibc keeps it at twice the mmap
threshold while adapting): left at its 128 KiB default, every `free` that leaves more than that free
at the heap's top hands it back, and the next batch faults it in again. `set_mmap_threshold` pins
the trim threshold at twice the mmap threshold, as glibc would; `release_freed` trims the rest
when it piles up.
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Any

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters
M_MMAP_THRESHOLD = -3
TRIM_INTERVAL_S = 0.05  # `release_freed`'s least interval between trims
TRIM_SLACK_BYTES = 8 << 20  # `release_freed` trims once the RSS has grown this much past its settled level
_PAGE = os.sysconf("SC_PAGE_SIZE")
_last_trim = [float("-inf")]  # monotonic time of this process's last trim
_settled: list[int | None] = [None]  # RSS at the first call after the last trim: the loop's working set back
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
    """Pin glibc's mmap threshold at `num_bytes` (no adaptation) and its trim threshold at twice
    that (module doc). False when not glibc or refused."""
    try:
        libc = glibc()
    except RuntimeError:
        return False
    pinned = libc.mallopt(M_MMAP_THRESHOLD, int(num_bytes)) == 1
    return pinned and libc.mallopt(M_TRIM_THRESHOLD, 2 * int(num_bytes)) == 1


def resident_bytes() -> int:
    """This process's resident set size now (`/proc/self/statm`: a few microseconds)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def release_freed(min_interval_s: float = TRIM_INTERVAL_S, slack_bytes: int = TRIM_SLACK_BYTES) -> None:
    """Hand the heap's free pages back to the OS (glibc `malloc_trim(0)`; nothing elsewhere) when
    they have piled up: at the first call, then whenever the RSS has grown by `slack_bytes` past
    its settled level (the RSS at the first call after the last trim), at most once per
    `min_interval_s` of the process's wall time.

    Batch tensors below the pinned mmap threshold come from the heap; freed, they stay resident
    and the heap fragments, so a loop's RSS creeps up with its number of batches (the fusion
    step: +21 MB from 100 to 400 images). Called once per batch by the evaluation, statistics and
    DP loops, it keeps them flat; a 64 KiB threshold did the same but made every such tensor its
    own mapping (fuse and train_private 1.3-1.7x slower, measured). A trim walks the whole heap
    (about 1.5 ms in a job of the default study), so it runs at most every `min_interval_s`: what
    stays resident between two trims is the work of that interval, whatever the number of batches.

    A trim also hands back the pages the next batch will use again, and that batch faults them in
    afresh. A loop whose batches free what the next ones reuse does not grow, so it is trimmed only
    when its RSS has grown: with a trim every 0.05 s, a DP-SGD job of the default study spent 20-25 %
    of its CPU in the kernel (0.5-0.7 of 2.6-3.1 CPU-s, 220k page faults; docs/performance.md).
    What stays resident past the loop's working set is at most `slack_bytes`, at any dataset size.

    Args:
        min_interval_s: skip the trim when the last one was more recent (0: no least interval).
        slack_bytes: the growth past the settled RSS that calls for a trim (0: trim at every call).
    """
    now = time.monotonic()
    if now - _last_trim[0] < min_interval_s:
        return
    if _last_trim[0] > float("-inf") and slack_bytes > 0:
        try:
            rss = resident_bytes()
        except OSError:  # no /proc: not Linux, so no glibc to trim either
            return
        if _settled[0] is None:  # the first call since the last trim: the working set is back
            _settled[0] = rss
            return
        if rss - _settled[0] < slack_bytes:
            return
    try:
        glibc().malloc_trim(0)
    except RuntimeError:
        pass
    _last_trim[0], _settled[0] = time.monotonic(), None
