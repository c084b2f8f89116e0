"""Uniform (or weighted) parameter averaging of models with the same architecture.

Wortsman et al., "Model soups: averaging weights of multiple fine-tuned models improves
accuracy without increasing inference time", ICML 2022 (the uniform soup). Models trained
from different random inits should be matched to an anchor first (`pipeline_src.matching`).
"""
from __future__ import annotations

from typing import Sequence

import torch


def check_same_keys(sds: list[dict], what: str = "soup") -> None:
    """Raise if the state dicts are empty or differ in keys or shapes."""
    if not sds:
        raise ValueError(f"{what}: no state dicts to merge")
    keys = set(sds[0])
    for i, sd in enumerate(sds[1:], start=1):
        if set(sd) != keys:
            raise ValueError(f"{what}: state dict {i} differs in keys: {sorted(keys ^ set(sd))[:5]}")
        for k in keys:
            if sd[k].shape != sds[0][k].shape:
                raise ValueError(f"{what}: '{k}' has shape {tuple(sd[k].shape)} in state dict {i}, "
                                 f"{tuple(sds[0][k].shape)} in state dict 0")


def weighted_average(sds: Sequence[dict], weights: Sequence[float] | None = None, *, normalize: bool = True,
                     keys: set[str] | None = None, what: str = "soup") -> dict:
    """The one weighted average of state dicts in this project: soups, TAFT compositions, merges.

    Each floating-point entry is Σ_i w_i·θ_i, accumulated in float64 and cast back to the
    first state dict's dtype (so the result does not depend on the component order beyond
    float64 rounding). Non-floating entries (integer counters) must be equal; they are copied.

    Args:
        sds: state dicts with equal keys and shapes.
        weights: one weight per state dict (default: uniform).
        normalize: divide by Σ w_i (weights must then be non-negative with a positive sum);
            False gives the plain weighted sum TAFT's composition and subtraction use, where a
            weight may be anything (`taft.compose.compose_deltas`).
        keys: average only these entries (others are left out of the result); default all.
        what: the caller's name, for error messages.
    """
    check_same_keys(list(sds), what)
    weights = [1.0] * len(sds) if weights is None else [float(w) for w in weights]
    if len(weights) != len(sds):
        raise ValueError(f"{what}: {len(weights)} weights for {len(sds)} state dicts")
    if normalize:
        if min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"{what}: need {len(sds)} non-negative weights with a positive sum, got {weights}")
        weights = [w / sum(weights) for w in weights]
    out = {}
    for k, ref in sds[0].items():
        if keys is not None and k not in keys:
            continue
        if not ref.is_floating_point():
            if any(not torch.equal(sd[k], ref) for sd in sds[1:]):
                raise ValueError(f"{what}: non-float entry '{k}' differs between models; cannot average")
            out[k] = ref.clone()
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for w, sd in zip(weights, sds):
            acc.add_(sd[k].to(ref.device, torch.float64), alpha=w)
        out[k] = acc.to(ref.dtype)
    return out
