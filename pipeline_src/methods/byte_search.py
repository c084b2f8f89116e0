"""Find any of many byte strings in a large buffer in one vectorised pass (the DP export's leak scan).

`needle in data` per needle costs one pass over the data each: a DP study's release scanned 42
exports x 4 files for 500 member ids twice (raw and JSON-escaped), 10 CPU-s of the default study
(docs/performance.md). Here every 8-byte window of the data is read as one uint64 (eight shifted
views), and the windows equal to some needle's last 8 bytes are the only candidates; each is then
compared byte for byte with the needles that end that way. Needles shorter than 8 bytes get their
own window length. Exact: a needle that occurs has its last window among the candidates.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np

WINDOW = 8
CHUNK = 1 << 24  # bytes of data per pass: the windows of a chunk are 8 bytes each (128 MiB)


def _windows(buf: np.ndarray, width: int) -> np.ndarray:
    """The little-endian integer of every `width`-byte window of `buf` (len(buf) - width + 1 of them)."""
    n = len(buf) - width + 1
    out = np.zeros(n, dtype=np.uint64)
    for j in range(width):
        out |= buf[j:j + n].astype(np.uint64) << np.uint64(8 * j)
    return out


def _key(tail: bytes) -> int:
    return int.from_bytes(tail, "little")


def find_any(data: bytes, needles: Iterable[bytes]) -> bytes | None:
    """A needle that occurs in `data` (of the first chunk with any), or None when none does.

    Args:
        data: the bytes to scan.
        needles: non-empty byte strings.
    """
    by_tail: dict[int, dict[int, list[bytes]]] = defaultdict(lambda: defaultdict(list))  # width -> tail -> needles
    for x in set(needles):
        if not x:
            raise ValueError("find_any: an empty needle is in everything")
        width = min(len(x), WINDOW)
        by_tail[width][_key(x[-width:])].append(x)
    wanted = {width: np.sort(np.fromiter(tails, dtype=np.uint64, count=len(tails))) for width, tails in by_tail.items()}
    buf = np.frombuffer(data, dtype=np.uint8)
    for start in range(0, len(buf), CHUNK):
        part = buf[start:start + CHUNK + WINDOW - 1]  # windows that begin in this chunk
        hits = []
        for width, tails in by_tail.items():
            if len(part) < width:
                continue
            windows = _windows(part, width)[:CHUNK]
            at = np.minimum(np.searchsorted(wanted[width], windows), len(tails) - 1)  # no sort of the windows
            for k in np.flatnonzero(wanted[width][at] == windows):
                end = start + int(k) + width  # the window's end in `data`
                for x in tails[int(windows[k])]:
                    if end >= len(x) and data[end - len(x):end] == x:
                        hits.append((end, x))
        if hits:
            return min(hits)[1]
    return None
