"""All N shard models of a non-linear method (fc, nlft, last) trained in one job, stacked over
shards: the tuned tensors get a leading shard axis, one `vmap(grad(...))` call over
`torch.func.functional_call` gives every shard's gradient, one stacked AdamW steps them all
(`optim.stacked_training.train_stacked`). Shard i ends as the method's own `train` on shard i
ends (same init, same seeded batch order, same schedule, its own step count when shards differ
in size), up to float rounding: tests/methods/test_vectorized.py, in float64.

Why: a shard model of the Fashion-MNIST study trains in about 4.5 s, much of it the job's fixed
cost (start, backbone, cache open) and GEMMs too small to use a core; one job for N shards pays
the fixed cost once and runs N-times-larger batched products (README "Where a study's time goes").
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from pipeline_src.methods.kinds import kind_of
from pipeline_src.methods.registry import first_samples_loss
from pipeline_src.optim.stacked_training import member_seeds, stack_params, train_stacked
from pipeline_src.vit.parts import FromPrefix

VECTORIZED_KINDS = ("fc", "nlft", "last")  # taft has its own (`taft.train.train_tangent_vectorized`)


def cross_entropy_gradients(model: nn.Module) -> tuple[list[tuple[str, torch.Tensor]], Callable]:
    """The trainable tensors of a tuned model (named as in `FromPrefix(model)`) and
    `fn(params, h, y, mask) -> (grads, losses)`: per shard, ∇ of the masked mean cross-entropy of
    `forward_from_prefix` w.r.t. stacked `params` ({name: (S, ...)}), batches h (S, b, ...), y (S, b),
    mask (S, b).

    Args:
        model: a tuned model (`TailFineTune`, `SideTuned`) whose trainable tensors require grad.
    """
    wrapper = FromPrefix(model)
    named = [(n, p) for n, p in wrapper.named_parameters() if p.requires_grad]

    def shard_loss(p: dict, h: torch.Tensor, y: torch.Tensor, mask: torch.Tensor):
        per = F.cross_entropy(functional_call(wrapper, p, (h,)), y, reduction="none")  # (batch,)
        total = (per * mask).sum() / mask.sum().clamp(min=1)
        return total, total.detach()

    return named, vmap(grad(shard_loss, has_aux=True))


def train_shards_vectorized(model: nn.Module, method_cfg: dict, shards: Sequence[tuple], settings: dict,
                            seeds: "int | Sequence[int]",
                            progress: Optional[Callable[[int, list[float]], None]] = None) -> list[dict]:
    """Train one copy of `model`'s tuned tensors per shard; returns per shard
    {"state": the tuned model's `trainable_state()`, "stats": as the method's `train` returns}.
    `model` ends holding the last shard's tensors.

    Args:
        model: a fresh tuned model (the shared init of every shard), on the training device.
        method_cfg: the method's config (`kind` fc, nlft or last).
        shards: (features, labels) per shard, features as the method's `train` takes them (a tensor or
            `CachedRows`; LAST: its stacked block outputs).
        settings: the training settings (`epochs`, `batch_size`, `lr`, `weight_decay`, `schedule`).
        seeds: per-shard batch-order seeds (`steps.train.shard_seed`).
        progress: called as progress(epoch, per-shard mean losses) after each epoch.
    """
    kind = kind_of(method_cfg).name
    if kind not in VECTORIZED_KINDS:
        raise ValueError(f"config key 'methods.*.kind': {kind!r} does not train vectorized here "
                         f"(this path: {VECTORIZED_KINDS}; taft: taft.train.train_tangent_vectorized)")
    seeds = member_seeds(seeds, len(shards))
    named, grad_fn = cross_entropy_gradients(model)
    params = stack_params(named, len(shards))
    t0 = time.perf_counter()
    with unfused_attention(model):
        out = train_stacked(params, grad_fn, shards, epochs=settings["epochs"], batch_size=settings["batch_size"],
                            lr=settings["lr"], seeds=seeds, weight_decay=settings["weight_decay"],
                            schedule=settings.get("schedule"), progress=progress)
    seconds = (time.perf_counter() - t0) / len(shards)
    results = []
    for i, (features, labels) in enumerate(shards):
        with torch.no_grad():
            for n, p in named:
                p.copy_(params[n][i])
        if kind == "last":  # as `registry.train_last`: the loss of the trained model on its first samples
            stats = {"train_loss": first_samples_loss(model, features, labels, settings["batch_size"])}
        else:  # as `training.fit`: the last epoch's mean batch loss
            stats = {"train_loss": out["histories"][i][-1], "train_seconds": seconds}
        results.append({"state": model.trainable_state(), "stats": stats})
    return results


@contextmanager
def unfused_attention(model: nn.Module) -> Iterator[None]:
    """timm's and the LAST side network's written-out attention (softmax(q kᵀ) v) inside the block:
    fused SDPA has no vmap batching rule on the CPU (a per-shard loop; measured 1.1-2.3x slower
    than N separate trainings at 400-sample shards), the written-out one batches over shards."""
    fused = [m for m in model.modules() if getattr(m, "fused_attn", False) is True]
    for m in fused:
        m.fused_attn = False
    try:
        yield
    finally:
        for m in fused:
            m.fused_attn = True
