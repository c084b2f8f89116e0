"""The prepared dataset on disk: `samples.parquet` (SAMPLES_SCHEMA) and `images.npy`, a uint8
(N, C, H, W) array that jobs read by row (`npy_rows.py`), so a job holds only its own images."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from pipeline_src.data.images import to_model_input
from pipeline_src.data.loader import image_batches
from pipeline_src.data.npy_rows import NpyRows
from pipeline_src.job.glibc_malloc import release_freed

IMAGES_FILE = "images.npy"


class Subset:
    """Labels of one set of samples, in the given order; `images` reads their rows only when asked.

    Args:
        store: the store the samples come from.
        ids: sample ids.
        rows: their samples-table rows.
        labels: int64 (N,).
    """

    def __init__(self, store: SampleStore, ids: list[str], rows: np.ndarray, labels: torch.Tensor) -> None:
        self.store, self.ids, self.rows, self.labels = store, ids, rows, labels

    @property
    def images(self) -> torch.Tensor:
        """uint8 (N, C, H, W) of these samples (read now; not cached)."""
        return self.store.image_rows(self.rows)


class StoredImages:
    """Normalised images of some samples, or a frozen model part's outputs on them, read and
    computed on `inputs[idx]`: a training loop's `inputs` (`methods.training.fit`, the TAFT and
    LAST loops) that holds no image or feature until its batch is drawn.

    With `prefix` it stands in for a shard's prefix features when there is no feature cache
    (`features.cache: false`): the frozen part runs under no_grad on each batch, every epoch, so a
    job's memory is one batch's, whatever its shard's size (LAST's own design: no backbone graph,
    no cache).

    Args:
        store: the prepared dataset.
        ids: the samples, in the order the loop's positions refer to.
        mean, std: the backbone's normalisation.
        device: where the batches go (and `prefix` runs).
        prefix: frozen model part, float (B, C, H, W) on `device` → features; None: the images.
        autocast: run `prefix` under bfloat16 autocast (CUDA only; `train.precision`); outputs are float32.
        chunk: images per pass of a slice.
    """

    def __init__(self, store: SampleStore, ids: list[str], mean: list[float], std: list[float],
                 device: torch.device | str, prefix: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 autocast: bool = False, chunk: int = 256) -> None:
        self.store, self.rows, self.mean, self.std = store, store.rows(ids), mean, std
        self.device, self.prefix, self.autocast, self.chunk = torch.device(device), prefix, autocast, chunk
        self._row_shape: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        """(n, ...) as the whole set's tensor would be (one sample is computed to learn it)."""
        if self._row_shape is None:
            self._row_shape = tuple(self[np.arange(min(1, len(self)))].shape[1:])
        return (len(self), *self._row_shape)

    @torch.no_grad()  # the frozen part; the training loop's graph starts at its output
    def _batch(self, pos: np.ndarray) -> torch.Tensor:
        # uint8 over the bus (a quarter of float32's bytes), normalised on the device
        x = to_model_input(self.store.image_rows(self.rows[pos]).to(self.device), self.mean, self.std)
        if self.prefix is None:
            return x
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
            out = self.prefix(x)
        return out.float() if self.autocast else out

    def __getitem__(self, idx: torch.Tensor | np.ndarray | slice) -> torch.Tensor:
        """The batch at these positions (a tensor or array of ints: one pass; a slice: chunk by chunk)."""
        if isinstance(idx, slice):
            pos = np.arange(len(self.rows))[idx]
            parts = [self._batch(pos[s:s + self.chunk]) for s in range(0, len(pos), self.chunk)]
            return torch.cat(parts) if parts else self._batch(pos)
        pos = np.asarray(idx.cpu() if isinstance(idx, torch.Tensor) else idx, dtype=np.int64).reshape(-1)
        return self._batch(pos)  # (B, ...) store rows of the batch, in its order


class SampleStore:
    """Read access to a prepared dataset folder."""

    def __init__(self, samples_path: str | Path) -> None:
        samples_path = Path(samples_path)
        # Arrow columns (and numpy views of the numeric ones), not a Python object per row: a
        # dict of 1.2M ids would cost about 1 GB in every job that opens the table.
        self.table = pq.read_table(samples_path)
        self._images_path = samples_path.with_name(IMAGES_FILE)
        self._images: NpyRows | None = None
        self._sample_ids = self.table.column("sample_id").combine_chunks()
        self._rows = self.table.column("row").to_numpy()
        self._labels = self.table.column("label").to_numpy()

    @property
    def image_array(self) -> NpyRows:
        """The uint8 (N, C, H, W) images on disk, read by row (nothing is read until asked)."""
        if self._images is None:
            self._images = NpyRows(self._images_path)
            if len(self._images) != self.table.num_rows:
                raise ValueError(f"{self._images_path}: {len(self._images)} images for {self.table.num_rows} "
                                 f"samples; rerun `prepare`")
        return self._images

    def image_rows(self, rows: np.ndarray | list[int]) -> torch.Tensor:
        """uint8 images of these rows, in the given order (only they are read)."""
        return torch.from_numpy(self.image_array.read(rows))

    def _where(self, task: str, split: str | None = None) -> pa.ChunkedArray:
        mask = pc.equal(self.table.column("task"), task)
        return mask if split is None else pc.and_(mask, pc.equal(self.table.column("split"), split))

    def ids(self, task: str, split: str) -> list[str]:
        """Sorted sample ids of one task's split (only they become Python strings)."""
        return sorted(pc.filter(self.table.column("sample_id"), self._where(task, split)).to_pylist())

    def num_classes(self, task: str) -> int:
        return int(pc.count_distinct(pc.filter(self.table.column("label"), self._where(task))).as_py())

    def _positions(self, ids: list[str]) -> np.ndarray:
        """Table positions of these ids, by Arrow's hash lookup against the id column (an unknown id
        is an error naming it)."""
        pos = pc.index_in(pa.array(list(ids), pa.string()), value_set=self._sample_ids)
        if pos.null_count:
            missing = next(i for i, p in zip(ids, pos.is_null().to_pylist()) if p)
            raise KeyError(f"sample id not in the prepared dataset: {missing}")
        return pos.to_numpy(zero_copy_only=False).astype(np.int64)

    def rows(self, ids: list[str]) -> np.ndarray:
        """Samples-table rows (images.npy and cache rows) of these ids, in their order (an unknown id
        is an error naming it)."""
        return self._rows[self._positions(ids)].astype(np.int64)

    def subset(self, ids: list[str]) -> Subset:
        """The samples with these ids (unknown ids are an error naming the id)."""
        pos = self._positions(ids)
        return Subset(self, list(ids), self._rows[pos].astype(np.int64),
                      torch.from_numpy(self._labels[pos].astype(np.int64)))

    def split(self, task: str, split: str) -> Subset:
        return self.subset(self.ids(task, split))

    @torch.no_grad()  # frozen parts and evaluation: no graph over a whole split
    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor], ids: list[str], mean: list[float], std: list[float],
              device: torch.device | str = "cpu", batch_size: int = 256, workers: int = 0,
              autocast: bool = False) -> torch.Tensor:
        """`fn` on the normalised images of these samples, read (`loader.py`) and converted to float
        on `device` one batch at a time.

        Args:
            fn: model part, float (B, C, H, W) on `device` → tensor.
            ids: sample ids, in output order.
            mean, std: the backbone's normalisation.
            device: where `fn` runs.
            batch_size: images per batch.
            workers: DataLoader workers reading the rows (`train.num_workers`).
            autocast: run `fn` under bfloat16 autocast (CUDA only; `train.precision`); outputs are float32.
        """
        rows = self.rows(ids)
        outs = []
        for images in image_batches(self.image_array, rows, batch_size, device, workers):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                out = fn(to_model_input(images, mean, std))
            outs.append(out.float() if autocast else out)
            release_freed()  # the batch's freed tensors leave the RSS (`job/glibc_malloc.py`)
        if not outs:
            raise ValueError("SampleStore.apply: no samples")
        return torch.cat(outs)
