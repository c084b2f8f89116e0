"""Training-time augmentation of the stored images (`train.augment`), made per batch.

The train transform is timm's `create_transform(is_training=True, ...)` (random resized crop,
flips, colour jitter, optional RandAugment/AutoAugment and random erasing), applied to each stored
uint8 image (already resized to `dataset.img_size`) as a PIL image. Each image's random draws are
seeded by (seed, epoch, sample id), so a run replays exactly and a sample gets the same
augmentation in whichever shard or batch it lands.

`AugmentedInputs` stands in for a training set's prefix features: the training loops index it
with a batch of positions (`inputs[idx]`) and get the frozen prefix of those images, augmented
for the current epoch (counted from the samples served: each epoch serves every sample once).
Cached features are computed once, so they cannot be augmented: augmentation needs
`features.cache: false` (checked at validation).
"""
from __future__ import annotations

import hashlib
import itertools
import multiprocessing as mp
import random
import signal
import time
from collections import deque
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from pipeline_src.data.sample_store import SampleStore

_worker_transform = None  # the transform of a pool worker process


def train_transform(augment: dict, img_size: int, in_chans: int, mean: Sequence[float], std: Sequence[float]):
    """timm's train transform for `train.augment` (its keys are `create_transform` arguments).

    Args:
        augment: the `train.augment` config (`enabled` is ignored here).
        img_size, in_chans: the stored images' size and channels (the output keeps them).
        mean, std: the backbone's normalisation.
    """
    from timm.data import create_transform

    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in augment.items() if k != "enabled"}
    return create_transform(input_size=(in_chans, img_size, img_size), is_training=True,
                            mean=tuple(mean), std=tuple(std), **kw)


def sample_seed(seed: int, epoch: int, sample_id: str) -> int:
    """The 63-bit seed of one sample's augmentation in one epoch."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{sample_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def augment_one(transform, image: np.ndarray, seed: int) -> torch.Tensor:
    """One uint8 (C, H, W) image through `transform` with every RNG it may draw from seeded by
    `seed` (torch, Python's `random`, NumPy's), restoring their states after."""
    from PIL import Image

    pil = Image.fromarray(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0))
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
            return transform(pil)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _pool_context():
    """Workers forked from multiprocessing's fork server, a clean single-threaded process that
    imported this module (torch, timm) once, not from the training process: a fork of that one
    inherits its threads' locks and its signal handlers (a CI run hung in `close()` on them)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "timm.data", "PIL.Image"])  # what a worker unpickles and runs
    return ctx


def _init_worker(transform) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the pool
    global _worker_transform
    torch.set_num_threads(1)
    _worker_transform = transform


def _augment_in_worker(item: tuple[np.ndarray, int]) -> np.ndarray:
    return augment_one(_worker_transform, *item).numpy()


class AugmentedInputs:
    """A training set's frozen-prefix features, made per batch from augmented images.

    With `workers` > 0 and the loop's shuffling (`order_seed`, `batch_size`: a fresh
    `torch.randperm(n, generator=Generator().manual_seed(order_seed))` per epoch, cut into
    consecutive batches, as `fit` and TAFT's loop draw it), the next `prefetch` batches are
    augmented by the pool while the model trains on the current one. Every request is checked
    against the prediction; a mismatch drops the prefetched batches and serves on demand, so the
    prediction changes the speed, never the values.

    Args:
        store: the prepared dataset.
        ids: the training samples, in the order the loop's positions refer to.
        transform: the train transform (`train_transform`).
        prefix: the tuned model's frozen prefix (float images on `device` → features).
        device: where `prefix` runs.
        seed: the augmentation seed (the shard's training seed).
        workers: processes augmenting a batch in parallel (0: in this process).
        autocast: run `prefix` under bfloat16 autocast (CUDA only).
        order_seed, batch_size: the training loop's shuffling, to prefetch (None: no prefetching).
        prefetch: batches augmented ahead.
    """

    def __init__(self, store: SampleStore, ids: list[str], transform, prefix: Callable[[torch.Tensor], torch.Tensor],
                 device: torch.device, seed: int, workers: int = 0, autocast: bool = False,
                 order_seed: int | None = None, batch_size: int | None = None, prefetch: int = 2) -> None:
        self.store, self.ids, self.transform, self.prefix = store, list(ids), transform, prefix
        self.rows = store.rows(self.ids)
        self.device, self.seed, self.workers, self.autocast = torch.device(device), seed, workers, autocast
        self.served = 0
        self._pool = None
        self._plan = self._predicted(order_seed, batch_size) if workers and order_seed is not None and batch_size else None
        self._pending: deque = deque()  # (epoch, positions, AsyncResult), in predicted order
        self._running: list = []  # every submitted AsyncResult not known to be done (close waits)
        self.prefetch, self.prefetched = prefetch, 0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def epoch(self) -> int:
        return self.served // len(self.ids)

    def _predicted(self, order_seed: int, batch_size: int) -> Iterator[tuple[int, list[int]]]:
        gen, n = torch.Generator().manual_seed(order_seed), len(self.ids)
        for epoch in itertools.count():
            perm = torch.randperm(n, generator=gen).tolist()
            for start in range(0, n, batch_size):
                yield epoch, perm[start:start + batch_size]

    def _items(self, positions: Sequence[int], epoch: int) -> list[tuple[np.ndarray, int]]:
        raw = self.store.image_array.read(self.rows[list(positions)])
        return [(raw[j], sample_seed(self.seed, epoch, self.ids[p])) for j, p in enumerate(positions)]

    def _submit(self, positions: Sequence[int], epoch: int):
        if self._pool is None:
            self._pool = _pool_context().Pool(self.workers, _init_worker, (self.transform,))
        self._running = [r for r in self._running if not r.ready()]
        self._running.append(self._pool.map_async(_augment_in_worker, self._items(positions, epoch)))
        return self._running[-1]

    def images(self, positions: Sequence[int], epoch: int) -> torch.Tensor:
        """Augmented, normalised float images (B, C, H, W) of these positions in this epoch (CPU)."""
        if self.workers == 0:
            return torch.stack([augment_one(self.transform, im, s) for im, s in self._items(positions, epoch)])
        while self._plan is not None and len(self._pending) <= self.prefetch:
            e, p = next(self._plan)
            self._pending.append((e, p, self._submit(p, e)))
        if self._pending and self._pending[0][:2] == (epoch, list(positions)):
            self.prefetched += 1
            return torch.from_numpy(np.stack(self._pending.popleft()[2].get()))
        self._pending.clear()  # not the predicted order: serve on demand from now on
        self._plan = None
        return torch.from_numpy(np.stack(self._submit(positions, epoch).get()))

    def __getitem__(self, idx) -> torch.Tensor:
        positions = torch.as_tensor(idx).reshape(-1).tolist()
        epoch = self.epoch
        self.served += len(positions)
        x = self.images(positions, epoch)
        if self.device.type == "cuda":
            x = x.pin_memory()
        x = x.to(self.device, non_blocking=True)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
            return self.prefix(x).float()

    def close(self, wait_s: float = 120.0) -> None:
        """Stop the pool once its submitted batches (a few prefetched ones at most) are done.

        Terminating busy workers can kill one that holds the result queue's lock, and then
        `Pool.terminate` waits for ever (it hung CI); idle workers leave on the pool's sentinels.
        Only when a batch is still not done after `wait_s` (a worker died) is the pool terminated.
        """
        if self._pool is None:
            return
        pool, self._pool, self._pending = self._pool, None, deque()
        deadline = time.monotonic() + wait_s
        for result in self._running:
            result.wait(max(0.0, deadline - time.monotonic()))
        if all(r.ready() for r in self._running):
            pool.close()
            pool.join()
        else:
            pool.terminate()
        self._running = []
