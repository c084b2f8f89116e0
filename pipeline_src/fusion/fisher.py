"""Fisher-weighted averaging with a diagonal Fisher per model.

Matena & Raffel, "Merging Models with Fisher-Weighted Averaging", NeurIPS 2022:
θ* = Σ_i F_i ⊙ θ_i / Σ_i F_i, element-wise, with F_i the diagonal Fisher of model i.

`diagonal_fisher` estimates F = E_x[(∇_θ log p_θ(y | x))²] over the model's own training
inputs, one exact per-example gradient each (torch.func.vmap over grad), where y is
  * the given true label when `labels` is passed (the "empirical Fisher"), or
  * the model's own predicted (argmax) label when `labels` is None.
Matena & Raffel use the expectation over y ~ p_θ(·|x); both variants here are cheaper
single-label estimates. When models are matched before merging, compute each Fisher on
the matched model (a rotation mixes coordinates, so a diagonal Fisher does not transform).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from pipeline_src.fusion.soup import check_same_keys, weighted_average
from pipeline_src.job.glibc_malloc import release_freed


def diagonal_fisher(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor | None = None,
                    batch_size: int = 32) -> dict[str, torch.Tensor]:
    """Mean over examples of squared per-example gradients of log p(y | x), per trainable parameter.

    Args:
        model: a classifier returning logits (B, K); evaluated in eval mode (restored after).
        inputs: (N, ...) examples: a tensor, or any view with `len` that returns a batch tensor when
            sliced (`CachedRows`, `StoredImages`): the sum of squares accumulates batch by batch,
            so only one batch of inputs is held.
        labels: (N,) true labels, or None to use the model's predicted labels.
        batch_size: examples per vmapped chunk (memory ∝ batch_size × parameter count).

    Returns:
        {parameter name: Fisher diagonal of the parameter's shape} for parameters with requires_grad.
    """
    count = len(inputs)
    if labels is not None and labels.shape != (count,):
        raise ValueError(f"fisher: labels shape {tuple(labels.shape)} != ({count},)")
    if count == 0:
        raise ValueError("fisher: no inputs")
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("fisher: the model has no trainable parameters")
    fixed = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    fixed.update(dict(model.named_buffers()))

    def log_lik(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, {**p, **fixed}, (x.unsqueeze(0),))  # (1, K)
        if logits.dim() != 2:
            raise ValueError(f"fisher: model must return logits (B, K), got shape {tuple(logits.shape)}")
        return torch.log_softmax(logits, dim=-1)[0].gather(0, y.reshape(1))[0]  # y is vmapped: no indexing

    per_example = vmap(grad(log_lik), in_dims=(None, 0, 0))
    was_training = model.training
    model.eval()
    # Fused SDPA has no vmap batching rule (slow fallback); timm's math path gives the same values.
    fused = [m for m in model.modules() if getattr(m, "fused_attn", False) is True]
    for m in fused:
        m.fused_attn = False
    try:
        acc = {n: torch.zeros_like(p) for n, p in params.items()}
        for start in range(0, count, batch_size):
            x = inputs[start:start + batch_size]
            if labels is None:
                with torch.no_grad():
                    y = model(x).argmax(-1)
            else:
                y = labels[start:start + batch_size].to(x.device)
            grads = per_example(params, x, y)  # {name: (b, *shape)}
            for name, g in grads.items():
                acc[name] += (g ** 2).sum(0)
            del grads
            release_freed()  # the batch's freed tensors leave the RSS (`job/glibc_malloc.py`)
    finally:
        model.train(was_training)
        for m in fused:
            m.fused_attn = True
    return {name: a / count for name, a in acc.items()}


def fisher_merge(sds: list[dict], fishers: list[dict], eps: float = 1e-8) -> dict:
    """Element-wise Σ_i (F_i + eps)·θ_i / Σ_i (F_i + eps); entries without a Fisher are averaged.

    Args:
        sds: state dicts to merge (matched first if they come from different inits).
        fishers: one `diagonal_fisher` result per state dict, all with the same keys.
        eps: floor added to every Fisher value so unvisited coordinates fall back to the mean.
    """
    check_same_keys(sds, "fisher")
    if len(fishers) != len(sds):
        raise ValueError(f"fisher: {len(fishers)} Fishers for {len(sds)} state dicts")
    keys = set(fishers[0])
    for i, f in enumerate(fishers):
        if set(f) != keys:
            raise ValueError(f"fisher: Fisher {i} has different keys from Fisher 0")
        for k in f:
            if k not in sds[0] or f[k].shape != sds[0][k].shape:
                raise ValueError(f"fisher: Fisher key '{k}' missing from the state dicts or of another shape")
    if eps < 0:
        raise ValueError(f"fisher: eps={eps} must be >= 0")
    out = weighted_average(sds, keys=set(sds[0]) - keys)
    for k in keys:
        ref = sds[0][k]
        num, den = torch.zeros_like(ref), torch.zeros_like(ref)
        for sd, f in zip(sds, fishers):
            w = f[k].to(ref.device, ref.dtype) + eps
            num += w * sd[k].to(ref.device, ref.dtype)
            den += w
        if (den <= 0).any():
            raise ValueError(f"fisher: zero total Fisher in '{k}'; use eps > 0")
        out[k] = num / den
    return {k: out[k] for k in sds[0]}
