"""Row access to large `.npy` arrays without holding them: a sequential writer and a row reader.

Both go through plain file reads and writes (`os.pread`), not `np.memmap`: pages a memory map
touches stay in the process's resident set until it unmaps them, so reading a whole test split
batch by batch would still grow the job's RSS with the split. Reads of rows sorted by position
are coalesced into one read per run of consecutive rows. The files are ordinary `.npy` files
(`np.load(path, mmap_mode="r")` opens them too).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline_src.store.atomic import commit, make_temp

MAX_READ_BYTES = 64 << 20  # one read at most: bounds the temporary buffer


class NpyWriter:
    """Writes an (N, ...) array row block by row block, in order, to a temporary file that
    `close()` renames onto `path` (atomic: a reader never sees a partial array).

    Args:
        path: destination `.npy`.
        shape: the full array's shape, rows first.
        dtype: numpy dtype.
    """

    def __init__(self, path: str | Path, shape: Sequence[int], dtype: np.dtype) -> None:
        self.path, self.shape, self.dtype = Path(path), tuple(int(s) for s in shape), np.dtype(dtype)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = make_temp(self.path)  # named after this process: a later run removes it if killed
        self._file = os.fdopen(fd, "wb")
        np.lib.format.write_array_header_2_0(self._file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                          "fortran_order": False, "shape": self.shape})
        self.rows_written = 0

    def write(self, start: int, block: np.ndarray) -> None:
        """Rows [start, start + len(block)); blocks must come in row order."""
        if start != self.rows_written:
            raise ValueError(f"{self.path}: rows must be written in order (got row {start}, "
                             f"expected {self.rows_written})")
        if tuple(block.shape[1:]) != self.shape[1:] or block.dtype != self.dtype:
            raise ValueError(f"{self.path}: block {block.shape} {block.dtype} does not fit rows of "
                             f"{self.shape[1:]} {self.dtype}")
        self._file.write(memoryview(np.ascontiguousarray(block)).cast("B"))  # no extra copy
        self.rows_written += len(block)

    def close(self) -> None:
        if self.rows_written != self.shape[0]:
            self.abort()
            raise RuntimeError(f"{self.path}: wrote {self.rows_written} of {self.shape[0]} rows")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        commit(self._tmp, self.path)  # the mode a plain open() gives under the job's umask (mkstemp made 0600)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)


class NpyRows:
    """Reads rows of a C-ordered `.npy` file by position.

    Args:
        path: the `.npy` file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            self.offset = f.tell()
        if fortran:
            raise ValueError(f"{self.path}: Fortran-ordered arrays are not supported")
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        expected = self.offset + self.shape[0] * self.row_bytes
        if os.path.getsize(self.path) != expected:
            raise ValueError(f"{self.path}: {os.path.getsize(self.path)} bytes, expected {expected} for "
                             f"{self.shape} {self.dtype}; rerun the step that writes it")

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """The rows at these positions, in the given order (a fresh array of only these rows)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            bad = int(rows[(rows < 0) | (rows >= len(self))][0])
            raise IndexError(f"{self.path}: row {bad} out of range (it has {len(self)} rows)")
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.dtype)
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        max_run = max(1, MAX_READ_BYTES // max(1, self.row_bytes))
        fd = os.open(self.path, os.O_RDONLY)
        try:
            i = 0
            while i < len(order):  # one read per run of consecutive rows
                j = i + 1
                while j < len(order) and ordered[j] == ordered[j - 1] + 1 and j - i < max_run:
                    j += 1
                size = (j - i) * self.row_bytes
                data = os.pread(fd, size, self.offset + int(ordered[i]) * self.row_bytes)
                if len(data) != size:
                    raise OSError(f"{self.path}: short read at row {int(ordered[i])}")
                out[order[i:j]] = np.frombuffer(data, self.dtype).reshape(j - i, *self.shape[1:])
                i = j
        finally:
            os.close(fd)
        return out
