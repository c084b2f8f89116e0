"""Batches of stored uint8 images, read by row through a `torch.utils.data.DataLoader`.

Each DataLoader item is one batch: its rows are read with one call (`NpyRows.read`), by
`workers` processes ahead of the model (`train.num_workers`), into pinned memory on CUDA so the
copy to the GPU can overlap compute (`non_blocking`). With 0 workers the batches are read in
this process, in order: the CPU path of before, bit for bit. Images stay uint8 until they are on
the device, so a batch crosses the bus at a quarter of its float size.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline_src.data.npy_rows import NpyRows


class RowBatches(Dataset):
    """Item k: the uint8 images (B, C, H, W) of the k-th batch of `rows`.

    Args:
        images: the image store.
        rows: rows to read, in order.
        batch_size: rows per batch (the last may be smaller).
    """

    def __init__(self, images: NpyRows, rows: Sequence[int] | np.ndarray, batch_size: int) -> None:
        self.images, self.rows, self.batch_size = images, np.asarray(rows, dtype=np.int64), batch_size

    def __len__(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    def __getitem__(self, k: int) -> torch.Tensor:
        return torch.from_numpy(self.images.read(self.rows[k * self.batch_size:(k + 1) * self.batch_size]))


def image_batches(images: NpyRows, rows: Sequence[int] | np.ndarray, batch_size: int, device: torch.device | str,
                  workers: int = 0) -> Iterator[torch.Tensor]:
    """uint8 batches of `rows`, in order, on `device`.

    Args:
        images: the image store.
        rows: rows to read.
        batch_size: rows per batch.
        device: where the batches go (pinned memory and `non_blocking` copies on CUDA).
        workers: DataLoader worker processes (0: read in this process).
    """
    device = torch.device(device)
    loader = DataLoader(RowBatches(images, rows, batch_size), batch_size=None, shuffle=False, num_workers=workers,
                        pin_memory=device.type == "cuda", persistent_workers=False,
                        prefetch_factor=2 if workers else None)
    for batch in loader:
        yield batch.to(device, non_blocking=True)
