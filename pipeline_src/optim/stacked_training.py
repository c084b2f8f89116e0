"""The training loop of N models stacked along a leading member axis, each on its own data:
N shard models of one method in one job (`vectorized_shards`).

Each member keeps the batch schedule it would have alone: its own seeded permutation per
epoch, ceil(n_i / batch_size) steps per epoch, a short last batch. Batches are padded to
`batch_size` with a 0/1 mask; a member with no batch left in the current epoch is frozen for
that step (no parameter, moment or step-count update). AdamW (`stacked_adamw.py`) and the
learning-rate schedule follow each member's own step count, so member i ends where a
separate loop (`methods.training.fit`, `taft.train.train_tangent`, `last.train.train_side_network`)
on shard i ends, up to float rounding (tested in float64). The gradient function is the
caller's (one `vmap(grad(...))` over members).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from pipeline_src.job.counters import counting
from pipeline_src.optim.schedule import lr_factor
from pipeline_src.optim.stacked_adamw import stacked_adamw_

# (stacked params, h (S, b, ...), y (S, b), mask (S, b)) -> (grads like params, per-member losses (S,))
GradFn = Callable[[dict, Tensor, Tensor, Tensor], tuple[dict, Tensor]]
# (stacked params, active members (S,) bool) -> None: a constraint applied after each step (in place)
Project = Callable[[dict, Tensor], None]


def check_data(features, labels: Tensor, batch_size: int) -> int:
    """The number of samples of one member's data; a clear error when it cannot train.

    Args:
        features: anything with `len` (a tensor, `CachedRows`).
        labels: (n,) classes.
        batch_size: samples per step.
    """
    n = len(labels)
    if len(features) != n:
        raise ValueError(f"features ({len(features)}) and labels ({n}) differ in length")
    if n == 0:
        raise ValueError("empty training set")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return n


def stack_params(named: Sequence[tuple[str, Tensor]], members: int) -> dict[str, Tensor]:
    """{name: (members, *shape)} copies of one model's tensors: every member starts from them."""
    return {n: p.detach().unsqueeze(0).repeat(members, *([1] * p.dim())).clone() for n, p in named}


def member_seeds(seed: "int | Sequence[int]", members: int) -> list[int]:
    """One shuffling seed per member (one int: the same for all)."""
    seeds = [int(seed)] * members if isinstance(seed, int) else [int(s) for s in seed]
    if len(seeds) != members:
        raise ValueError(f"{len(seeds)} seeds for {members} shards")
    return seeds


def train_stacked(params: dict[str, Tensor], grad_fn: GradFn, shards: Sequence[tuple], *, epochs: int,
                  batch_size: int, lr: float, seeds: Sequence[int], weight_decay: float = 0.0,
                  schedule: Optional[dict] = None, project: Optional[Project] = None,
                  progress: Optional[Callable[[int, list[float]], None]] = None) -> dict:
    """Train stacked `params` in place, member i on `shards[i]`.

    Args:
        params: {name: (S, *shape)}, on the training device and dtype; updated in place (the dict's
            values may be replaced by `project`).
        grad_fn: per-member gradients of the masked mean loss and the (S,) losses (see `GradFn`).
        shards: (features, labels) per member; features index like a tensor (`CachedRows` reads rows).
        epochs: passes over each member's data.
        batch_size: samples per step.
        lr: AdamW learning rate (betas and eps as `torch.optim.AdamW`'s defaults).
        seeds: per-member seeds of the torch.Generator that shuffles each epoch.
        weight_decay: AdamW's decoupled weight decay.
        schedule: `train.schedule`, per member at its own step; None: constant.
        project: applied after each step to the active members (e.g. a ball constraint).
        progress: called as progress(epoch, per-member mean losses) after each epoch.

    Returns:
        {"histories": per-member lists of per-epoch sample-weighted mean losses,
         "steps_per_epoch": per member, "sizes": per member}.
    """
    S = len(shards)
    if S == 0:
        raise ValueError("no shards to train")
    sizes = [check_data(f, y, batch_size) for f, y in shards]
    first = next(iter(params.values()))
    device, dtype = first.device, first.dtype
    exp_avg = {n: torch.zeros_like(p) for n, p in params.items()}
    exp_avg_sq = {n: torch.zeros_like(p) for n, p in params.items()}
    step_count = torch.zeros(S, dtype=torch.long, device=device)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    steps_per_epoch = [math.ceil(n / batch_size) for n in sizes]
    histories: list[list[float]] = [[] for _ in range(S)]
    for epoch in range(epochs):
        perms = [torch.randperm(n, generator=g) for n, g in zip(sizes, gens)]
        totals = torch.zeros(S, dtype=torch.float64)
        for step in range(max(steps_per_epoch)):
            h, y, mask, counts = padded_batch(shards, perms, step, batch_size, device, dtype)
            active = (counts > 0).to(device)  # (S,)
            with counting("train", int(counts.sum()), device):  # FLOPs of the padded batch, as computed
                grads, losses = grad_fn(params, h, y, mask)
            step_count += active
            lrs = lr if not schedule or schedule.get("name") == "constant" else torch.tensor(  # per member, its own step
                [lr * lr_factor(schedule, k - 1, spe, spe * epochs) for k, spe in zip(step_count.tolist(),
                                                                                    steps_per_epoch)],
                dtype=torch.float64, device=device)
            for n in params:
                stacked_adamw_(params[n], grads[n], exp_avg[n], exp_avg_sq[n], step_count, lrs, weight_decay,
                               active=active)
            if project is not None:
                project(params, active)
            totals += losses.detach().double().cpu() * counts
        for i in range(S):
            histories[i].append(float(totals[i]) / sizes[i])
        if progress is not None:
            progress(epoch, [hist[-1] for hist in histories])
    return {"histories": histories, "steps_per_epoch": steps_per_epoch, "sizes": sizes}


def padded_batch(shards: Sequence[tuple], perms: Sequence[Tensor], step: int, batch_size: int, device, dtype):
    """Step `step` of every member's schedule, padded to batch_size: h (S, b, ...), y (S, b),
    mask (S, b) and the real counts (S,) on CPU (a finished member gets a batch of padding)."""
    hs, ys, masks, counts = [], [], [], []
    for (feats, labels), perm in zip(shards, perms):
        idx = perm[step * batch_size:(step + 1) * batch_size]
        c = len(idx)
        pad = torch.zeros(batch_size, dtype=torch.long)
        pad[:c] = idx
        hs.append(feats[pad])
        ys.append(labels[pad])
        m = torch.zeros(batch_size, dtype=dtype)
        m[:c] = 1
        masks.append(m)
        counts.append(c)
    return (torch.stack(hs).to(device=device, dtype=dtype), torch.stack(ys).to(device),
            torch.stack(masks).to(device), torch.tensor(counts))
