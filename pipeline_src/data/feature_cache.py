"""Out-of-core feature caches: one memory-mappable `.npy` array per cache plus a JSON sidecar.

A job reads only the rows it needs (`npy_rows.NpyRows`: positional reads, sorted so they go
forward through the file; the file is an ordinary `.npy` that `np.load(mmap_mode="r")` opens
too) and gets float32 torch tensors, converted chunk by chunk, so its memory depends on its own
rows, never on the dataset's size. `CachedRows` goes further: a view of a shard's rows that
reads only a batch's rows when a training loop indexes it, so a job holds one batch.

Layout of `features.npy`: row i = samples-table row i.
    `last{k}` caches: (num_samples, tokens, dim);
    `blocks` caches:  (num_samples, len(blocks), tokens, dim), where `blocks` (in the sidecar)
    are the backbone block indices kept (0 = the embedding, k = output of block k), only those
    a LAST configuration of the study reads (Tang et al., "Low-Rank Attention Side-Tuning", 2024).
Storage dtype (`features.dtype`): float16, bfloat16 (stored as its uint16 bit pattern, since
numpy has no bfloat16) or float32.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from pipeline_src.data.npy_rows import NpyRows, NpyWriter
from pipeline_src.store.atomic import write_json

# storage dtype name -> numpy dtype on disk
STORAGE = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16), "float32": np.dtype(np.float32)}
READ_CHUNK_BYTES = 64 << 20  # rows converted to float32 at a time (bounds the temporary copies)


def sidecar_path(path: str | Path) -> Path:
    """`features.json` beside `features.npy`."""
    return Path(path).with_suffix(".json")


TORCH_STORAGE = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def to_storage(x: torch.Tensor, dtype: str) -> np.ndarray:
    """A float tensor as the numpy array stored for `dtype` (bfloat16: its bit pattern).

    The cast runs where `x` is (on a GPU: before the copy, which then moves half the bytes of float32).
    """
    x = x.detach().to(TORCH_STORAGE[dtype]).cpu()
    if dtype == "bfloat16":
        return x.view(torch.int16).numpy().view(np.uint16)
    return x.numpy()


class FeatureCacheWriter:
    """Writes a cache in row order, chunk by chunk, to a temporary file; `close()` renames it
    into place and then writes the sidecar.

    Args:
        path: the final `.npy` path (its sidecar goes beside it).
        shape: full array shape, rows first.
        dtype: storage dtype name (`STORAGE`).
        meta: sidecar fields (cache name, kept blocks, ...).
    """

    def __init__(self, path: str | Path, shape: Sequence[int], dtype: str, meta: dict) -> None:
        if dtype not in STORAGE:
            raise ValueError(f"features.dtype: '{dtype}' is not one of {sorted(STORAGE)}")
        self.path, self.dtype, self.shape = Path(path), dtype, tuple(int(s) for s in shape)
        self.meta = {**meta, "shape": list(self.shape), "dtype": dtype, "format": "npy-rows-v1"}
        self._writer = NpyWriter(self.path, self.shape, STORAGE[dtype])

    @property
    def rows_written(self) -> int:
        return self._writer.rows_written

    def write(self, start: int, x: torch.Tensor) -> None:
        """Store rows [start, start + len(x)) (in row order)."""
        self.write_stored(start, to_storage(x, self.dtype))

    def write_stored(self, start: int, block: np.ndarray) -> None:
        """Store rows already converted by `to_storage` (the file write alone: a writer thread's part)."""
        self._writer.write(start, block)

    def close(self) -> None:
        self._writer.close()  # the array first: a sidecar always describes a complete array
        write_json(self.meta, sidecar_path(self.path))

    def abort(self) -> None:
        self._writer.abort()


class FeatureCache:
    """Read access to one cache: `rows(r)` reads only rows r, as float32.

    Args:
        path: the cache's `.npy` file (its sidecar `.json` beside it).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.meta = json.loads(sidecar_path(self.path).read_text())
        except (OSError, ValueError) as e:
            raise FileNotFoundError(f"feature cache {self.path}: no readable sidecar {sidecar_path(self.path).name} "
                                    f"({e}); rerun the `features` rule") from e
        self.array = NpyRows(self.path)
        if list(self.array.shape) != self.meta["shape"]:
            raise ValueError(f"feature cache {self.path}: array shape {self.array.shape} "
                             f"does not match its sidecar {self.meta['shape']}")
        self.dtype = self.meta["dtype"]
        self.blocks = self.meta.get("blocks")  # block indices kept (blocks caches only)

    def __len__(self) -> int:
        return len(self.array)

    def positions(self, blocks: Sequence[int]) -> list[int]:
        """Positions in the stored block axis of these backbone block indices (error names missing ones)."""
        if self.blocks is None:
            raise ValueError(f"feature cache {self.path}: not a blocks cache, cannot select blocks {list(blocks)}")
        missing = [b for b in blocks if b not in self.blocks]
        if missing:
            raise KeyError(f"feature cache {self.path} keeps blocks {self.blocks}, not {missing}: the study's LAST "
                           f"settings changed since it was built; rerun the `features` rule")
        return [self.blocks.index(b) for b in blocks]

    def rows(self, rows: Sequence[int] | torch.Tensor | np.ndarray, blocks: Sequence[int] | None = None) -> torch.Tensor:
        """float32 features of these samples-table rows, in the given order.

        Args:
            rows: samples-table row numbers (any order, repeats allowed).
            blocks: for a blocks cache, the backbone block indices to return (dim 1, in this
                order); None returns every stored block.
        """
        rows = np.asarray(rows.cpu() if isinstance(rows, torch.Tensor) else rows, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(rows) and (rows.min() < 0 or rows.max() >= n):
            bad = int(rows[(rows < 0) | (rows >= n)][0])
            raise IndexError(f"feature cache {self.path}: row {bad} out of range (it has {n} rows); "
                             f"rerun `features` after `prepare`")
        pos = None if blocks is None else np.asarray(self.positions(blocks))
        row_shape = self.array.shape[1:] if pos is None else (len(pos), *self.array.shape[2:])
        out = torch.empty((len(rows), *row_shape), dtype=torch.float32)
        step = max(1, READ_CHUNK_BYTES // max(1, self.array.row_bytes))
        for s in range(0, len(rows), step):  # float32 conversion a chunk at a time
            out[s:s + step] = self.stored_rows(rows[s:s + step], blocks)
        return out

    def stored_rows(self, rows: np.ndarray, blocks: Sequence[int] | None = None) -> torch.Tensor:
        """These rows as stored (float16, bfloat16 or float32; no conversion), in the given order."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        chunk = self.array.read(rows)  # the callers checked the range
        if blocks is not None:
            chunk = chunk[:, np.asarray(self.positions(blocks))]
        chunk = np.ascontiguousarray(chunk)
        if self.dtype == "bfloat16":
            return torch.from_numpy(chunk.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(chunk)

    def __getitem__(self, rows) -> torch.Tensor:
        return self.rows(rows)


RESIDENT_SHARE = 0.25  # of the GPU's free memory, at most, for a view's rows held there


class CachedRows:
    """Some rows of a cache, read and converted to float32 on `device` only when indexed: the
    `inputs` of a training loop (`methods.training.fit`, `taft.train`, `last.train`) that holds one
    batch, never its whole shard. `view[idx]` equals `cache.rows(rows)[idx]` bit for bit (the same
    reads and the same float32 conversion), so training from it gives the same model.

    On a GPU the view's rows are resident there (`resident`): read once, as stored (half precision:
    ViT-B/16's 197 x 768 tokens are 302 kB a row), on the first index, then each batch is a gather
    and a float32 conversion on the device, with no host work per batch (no reads, no copies; every
    epoch of the shard reads the file once). That needs the rows to fit in `RESIDENT_SHARE` of the
    GPU's free memory; a larger view reads each batch's rows as on the CPU.

    Args:
        cache: the feature cache.
        rows: samples-table rows; position i of the view is row `rows[i]`.
        device: where indexed batches go.
        blocks: for a blocks cache, the backbone block indices to return (as `FeatureCache.rows`).
        resident: hold the rows on `device` after the first index; None: on a GPU where they fit.
    """

    def __init__(self, cache: FeatureCache, rows: Sequence[int] | np.ndarray, device: torch.device | str = "cpu",
                 blocks: Sequence[int] | None = None, resident: bool | None = None) -> None:
        self.cache, self.device = cache, torch.device(device)
        self.rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        self.blocks = None if blocks is None else list(blocks)
        n = len(cache)
        if len(self.rows) and (self.rows.min() < 0 or self.rows.max() >= n):  # fail before training, not mid-epoch
            bad = int(self.rows[(self.rows < 0) | (self.rows >= n)][0])
            raise IndexError(f"feature cache {cache.path}: row {bad} out of range (it has {n} rows); "
                             f"rerun `features` after `prepare`")
        row_shape = tuple(cache.array.shape[1:])
        if self.blocks is not None:
            row_shape = (len(cache.positions(self.blocks)), *row_shape[1:])  # names missing blocks now
        self.shape = (len(self.rows), *row_shape)
        self.resident = self._fits_on_device() if resident is None else resident
        self._held: torch.Tensor | None = None  # the rows as stored, on `device` (resident views)

    def _fits_on_device(self) -> bool:
        if self.device.type != "cuda":
            return False  # the CPU path holds one batch: a job's RSS is its batch's, not its shard's
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * STORAGE[self.cache.dtype].itemsize
        return nbytes <= RESIDENT_SHARE * torch.cuda.mem_get_info(self.device)[0]

    def _stored_on_device(self) -> torch.Tensor:
        """Every row of the view as stored, on `device`: read in chunks of READ_CHUNK_BYTES into one tensor."""
        if self._held is None:
            held = torch.empty(self.shape, dtype=TORCH_STORAGE[self.cache.dtype], device=self.device)
            row_bytes = max(1, int(np.prod(self.shape[1:], dtype=np.int64)) * STORAGE[self.cache.dtype].itemsize)
            step = max(1, READ_CHUNK_BYTES // row_bytes)
            for s in range(0, len(self.rows), step):
                chunk = self.cache.stored_rows(self.rows[s:s + step], blocks=self.blocks)
                held[s:s + step].copy_(chunk.pin_memory() if self.device.type == "cuda" else chunk, non_blocking=True)
            self._held = held
        return self._held

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: torch.Tensor | np.ndarray | slice) -> torch.Tensor:
        """float32 (B, ...) features of these positions (a tensor or array of ints, or a slice), on `device`."""
        if self.resident:  # (B, ...) gathered on the device from the held rows: the same values, converted the same way
            if isinstance(idx, slice):
                pos_t = torch.arange(len(self.rows))[idx]
            elif isinstance(idx, torch.Tensor):
                pos_t = idx.reshape(-1)  # kept where it is: a position tensor on the GPU costs no host sync
            else:
                pos_t = torch.as_tensor(np.asarray(idx, dtype=np.int64).reshape(-1))
            return self._stored_on_device()[pos_t.to(self.device, torch.int64)].float()
        if isinstance(idx, slice):
            pos = np.arange(len(self.rows))[idx]
        else:
            pos = np.asarray(idx.cpu() if isinstance(idx, torch.Tensor) else idx, dtype=np.int64).reshape(-1)
        if self.device.type == "cpu":
            return self.cache.rows(self.rows[pos], blocks=self.blocks)
        # On a GPU: copy the stored half-precision rows and convert there (exact, as on the CPU)
        return self.cache.stored_rows(self.rows[pos], blocks=self.blocks).to(self.device).float()

