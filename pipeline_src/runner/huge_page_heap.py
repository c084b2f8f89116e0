"""The fork server's heap on transparent huge pages, and its jobs' memory as it was.

Every job is a fork of the server, which holds ~860 MB of imports. A fork copies a page-table
entry per 4 KiB page of the server's private memory and the child's exit frees as many: ~45 ms of
kernel time a job, and the page faults are few (`benchmarks/bench_fork_cost.py`). glibc's
`glibc.malloc.hugetlb=1` tunable makes it ask for transparent huge pages (`madvise`) for its heap,
where a 2 MiB page needs one entry instead of 512. The server's 192 MB heap then took 28.6-29.7 ms
a fork against 38.8-48.6 (docs/performance.md). Python's own object arenas are not glibc's heap
and stay in small pages.

A job inherits the tunable's effect with the fork: glibc would go on advising huge pages for the
job's own heap and mapped tensors. Where the kernel gives huge pages only to advised memory
(`madvise`, the common default), `small_pages_as_before` turns them off for the job, so a job's
memory is what it was before the server used them. Where the kernel gives them to all memory
(`always`), jobs had them before as well, and nothing changes.
"""
from __future__ import annotations

import ctypes
import os

TUNABLE = "glibc.malloc.hugetlb"
HUGE_PAGE_HEAP = f"{TUNABLE}=1"
ADDED = "PIPELINE_HUGE_PAGE_HEAP"  # set beside the tunable where this module added it, not the user
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
PR_SET_THP_DISABLE = 41  # linux/prctl.h


def with_huge_page_heap(env: dict[str, str]) -> dict[str, str]:
    """`env` with glibc told to put the heap on huge pages (`GLIBC_TUNABLES`), unless its own
    tunables say something of `glibc.malloc.hugetlb` already (the user's word wins).

    Args:
        env: the environment the server is to start with.
    """
    tunables = env.get("GLIBC_TUNABLES", "")
    if TUNABLE in tunables:
        return dict(env)
    return {**env, "GLIBC_TUNABLES": ":".join(t for t in (tunables, HUGE_PAGE_HEAP) if t), ADDED: "1"}


def thp_mode(path: str = THP_MODE_FILE) -> str | None:
    """The kernel's transparent huge page mode (`always`, `madvise` or `never`, the bracketed
    one of the file); None where the file is missing or unreadable."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def small_pages_as_before(mode: str | None = None) -> bool:
    """In a job just forked from a server that `with_huge_page_heap` started (its environment still
    the server's): turn transparent huge pages off for this process (and what it starts) where the
    kernel gives them only to advised memory. Returns whether it did.

    Args:
        mode: the kernel's mode (default: `thp_mode()`).
    """
    if os.environ.get(ADDED) != "1" or (mode if mode is not None else thp_mode()) != "madvise":
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False
