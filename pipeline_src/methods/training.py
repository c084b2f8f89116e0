"""One plain training loop (AdamW, seeded shuffling, progress bar) shared by the methods."""
from __future__ import annotations

import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from pipeline_src.data.throughput import Throughput
from pipeline_src.job.counters import counting
from pipeline_src.job.glibc_malloc import release_freed
from pipeline_src.optim.adamw import adamw
from pipeline_src.optim.schedule import apply_schedule


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"cross_entropy": cross_entropy}


def fit(
    forward: Callable[[torch.Tensor], torch.Tensor],
    params: list[torch.nn.Parameter],
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    seed: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy,
    desc: str = "train",
    schedule: dict | None = None,
) -> dict[str, float]:
    """Minimise `loss_fn(forward(x), y)` over `params` with AdamW.

    Args:
        forward: maps a batch of `inputs` to logits.
        params: the parameters to train (everything else is frozen).
        inputs, labels: the whole training set, already on the training device (or inputs made per
            batch: anything with `len`, `device` and `inputs[idx]`, e.g. `data.augment.AugmentedInputs`, or
            `data.feature_cache.CachedRows`, which reads a batch's cache rows when drawn).
        seed: seeds the batch order (a generator of its own, so no global RNG is touched).
        schedule: `train.schedule` (`optim/schedule.py`), applied per optimizer step; None: constant.
    Returns:
        The last epoch's mean loss and the wall time (each epoch's loss and images/s are printed).
    """
    if len(inputs) == 0:
        raise ValueError(f"{desc}: no training samples")
    opt = adamw(params, lr=lr, weight_decay=weight_decay)  # fused: optim/adamw.py
    gen = torch.Generator().manual_seed(seed)
    steps_per_epoch = -(-len(inputs) // batch_size)
    t0 = time.perf_counter()
    bar = tqdm(total=epochs * steps_per_epoch, desc=desc, file=sys.stderr, mininterval=2.0, disable=None)
    epoch_loss = float("nan")
    step = 0
    meter = Throughput(desc)
    for epoch in range(epochs):
        order = torch.randperm(len(inputs), generator=gen).to(inputs.device)
        total = 0.0
        for start in range(0, len(inputs), batch_size):
            idx = order[start:start + batch_size]
            with counting("train", len(idx), inputs.device, memory=True):
                loss = loss_fn(forward(inputs[idx]), labels[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                apply_schedule(opt, lr, schedule, step, steps_per_epoch, epochs * steps_per_epoch)
                opt.step()
            step += 1
            total += loss.item() * len(idx)
            bar.update(1)
        epoch_loss = total / len(inputs)
        bar.set_postfix(loss=f"{epoch_loss:.4f}")
        meter.epoch(epoch, epochs, len(inputs), epoch_loss)
    bar.close()
    return {"train_loss": epoch_loss, "train_seconds": time.perf_counter() - t0}


@torch.no_grad()
def batched_apply(fn: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Apply `fn` to `inputs` in chunks and concatenate (for features and evaluation).

    Args:
        fn: maps a batch to outputs.
        inputs: a tensor, or anything sliceable with `len` (`CachedRows` reads each chunk's rows then).
        batch_size: rows per chunk.
    """
    outs = []
    for i in range(0, len(inputs), batch_size):
        outs.append(fn(inputs[i:i + batch_size]))
        release_freed()  # the batch's freed tensors leave the RSS (`job/glibc_malloc.py`)
    return torch.cat(outs)
