"""DP training in the fc regime from the head's inputs, computed once per sample.

In the fc regime (Liu & Soatto et al. 2024, "Tangent Transformers...", §3.4, Table 3: the head's Δ
only; for nlft and last their head) every parameter before the head is frozen, so the head sees the
same input for a sample at every step: the frozen tail is a fixed function of the sample. The DP job
(`steps/privacy/train.py`) then runs that tail once per sample, keeps the head's inputs in a file of
its own (written and read with plain file I/O: memory for one batch, not for the shard), and trains the head alone on them: the same
model up to rounding, without a forward of the tail per step (the default study's fc jobs: most of
their time; the paper protocol's full-batch ones ran the tail 50 times per sample).

Per kind, the module whose output makes the logits and how:
- nlft: the ViT's `head` (timm's `forward_head` ends with it; its `head_drop` is frozen, in eval);
- taft: the TangentLinear `head`, called with (features, tangent), its (y, dy) made logits by
  `TangentViT.logits` (f + J·Δw, or J·Δw alone);
- last: the side network's `head`.
A DeiT's distilled pair of heads is left to the full path. The first batch checks that the head path
gives the full model's logits.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from pipeline_src.data.npy_rows import NpyRows, NpyWriter
from pipeline_src.store.atomic import make_temp


class HeadOnly(nn.Module):
    """`forward(inputs) = combine(head(*args))`: the tuned model from its head's inputs, `args` being
    `inputs` with None put back where the head took None.

    Args:
        head: the module whose output makes the logits (its parameters are the model's own).
        combine: its output -> logits.
        given: per positional input of the head, whether it is a tensor (else None).
    """

    def __init__(self, head: nn.Module, combine: Callable[..., torch.Tensor], given: list[bool]) -> None:
        super().__init__()
        self.head = head
        self._combine, self._given = combine, list(given)

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        rest = iter(inputs)
        return self._combine(self.head(*[next(rest) if g else None for g in self._given]))


class HeadInputRows:
    """The rows of one head-input file, read at positions (a tensor or array) or a slice, as a tensor
    (`data.npy_rows.NpyRows`: plain reads, no memory map, so the job's RSS holds one batch).

    Args:
        path: the file (`.npy` layout).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._rows = NpyRows(path)
        self.shape = self._rows.shape

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, slice):
            index = np.arange(len(self))[index]
        elif isinstance(index, torch.Tensor):
            index = index.cpu().numpy()
        return torch.from_numpy(self._rows.read(index))


def head_call(model: nn.Module, kind: str) -> tuple[nn.Module, Callable[..., torch.Tensor]] | None:
    """(module whose output makes the logits, output -> logits) of a tuned model; None where the
    fc path does not apply (another kind, a distilled pair of heads)."""
    if kind == "nlft":
        return model.model.head, lambda y: y
    if kind == "taft" and model.head_dist is None:
        return model.head, lambda out: model.logits(*out)
    if kind == "last":
        return model.side.head, lambda y: y
    return None


def only_head_trains(model: nn.Module, head: nn.Module) -> bool:
    """Whether every trainable parameter of `model` is one of `head`'s (and there is one)."""
    own = {id(p) for p in head.parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    return bool(trainable) and all(id(p) in own for p in trainable)


@torch.no_grad()
def head_inputs(model: nn.Module, head: nn.Module, combine: Callable[..., torch.Tensor], features,
                batch_size: int, beside: str | Path) -> list[HeadInputRows | None]:
    """The head's inputs for every row of `features`, one temporary file per input beside `beside`
    (named as `store.atomic`'s, so a run's start removes those of a killed job; the caller removes
    them after training), None for an input that is None (TAFT's tangent when nothing before the
    head has a Δ).

    Args:
        model: the tuned model (`forward_from_prefix`), only its head trainable.
        head, combine: `head_call(model, kind)`.
        features: its prefix features, a tensor or a view sliced per batch (`CachedRows`, `StoredImages`).
        batch_size: rows per forward.
        beside: the job's output file (the temporary files go to its folder).
    Raises:
        RuntimeError: the head is not called exactly once per forward, or the head path does not give
            the model's logits on the first batch.
    """
    seen: list[tuple] = []
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args))
    writers: list[NpyWriter | None] | None = None
    n = len(features)
    try:
        for start in range(0, n, batch_size):
            seen.clear()
            logits = model.forward_from_prefix(features[start:start + batch_size])
            if len(seen) != 1:
                raise RuntimeError(f"fc head path: the head ran {len(seen)} times in one forward (expected once)")
            args = seen[0]
            if writers is None:
                if not torch.equal(combine(head(*args)), logits):
                    raise RuntimeError("fc head path: the head's output does not give the model's logits")
                writers = [None if a is None else _writer(beside, i, a, n) for i, a in enumerate(args)]
            for w, a in zip(writers, args):
                if w is not None:
                    w.write(start, a.cpu().numpy())
        for w in writers or []:
            if w is not None:
                w.close()
    except BaseException:
        for w in writers or []:
            if w is not None:
                w.abort()
                w.path.unlink(missing_ok=True)
        raise
    finally:
        hook.remove()
    return [None if w is None else HeadInputRows(w.path) for w in writers or []]


def _writer(beside: str | Path, i: int, a: torch.Tensor, n: int) -> NpyWriter:
    """A writer of (n, *row) rows of `a`'s dtype to a file beside `beside` named as `store.atomic`'s
    temporaries (this process's: a later run removes it if the job is killed)."""
    fd, path = make_temp(Path(beside).with_name(f"{Path(beside).stem}.head_input{i}.npy"))
    os.close(fd)
    return NpyWriter(path, (n, *a.shape[1:]), torch.empty(0, dtype=a.dtype).numpy().dtype)
