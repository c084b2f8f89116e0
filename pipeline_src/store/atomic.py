"""Atomic file writes: write to a temporary sibling, then rename.

An interrupted job therefore never leaves a half-written checkpoint or Parquet file.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq


def _umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask sets it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` on success.

    Args:
        path: final destination. Parent folders are created.
        mode: the file's mode (e.g. 0o600 for a private file); None: 0666 & ~umask.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # The mode a plain open() gives (0666 & ~umask), whatever the writer did (mkstemp and some
        # writers make 0600, which os.replace keeps): results stay readable to the user's group.
        os.chmod(tmp_path, 0o666 & ~_umask() if mode is None else mode)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_parquet(table: pa.Table, path: str | os.PathLike, mode: int | None = None) -> None:
    """Write a pyarrow table atomically (`mode`: as `atomic_path`)."""
    with atomic_path(path, mode) as tmp:
        pq.write_table(table, tmp)


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write JSON atomically (sorted keys, so equal inputs give equal bytes)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write text atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
