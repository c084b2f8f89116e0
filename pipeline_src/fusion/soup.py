"""Uniform (or weighted) parameter averaging of models with the same architecture.

Wortsman et al., "Model soups: averaging weights of multiple fine-tuned models improves
accuracy without increasing inference time", ICML 2022 (the uniform soup). Models trained
from different random inits should be matched to an anchor first (`pipeline_src.matching`).
"""
from __future__ import annotations

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


def average_state_dicts(sds: list[dict], weights: list[float] | None = None,
                        keys: set[str] | None = None) -> dict:
    """Weighted average Σ w_i·θ_i / Σ w_i of every floating-point entry.

    Args:
        sds: state dicts with equal keys and shapes.
        weights: one non-negative weight per state dict (default: uniform).
        keys: average only these entries (others are left out of the result); default all.

    Non-floating entries (e.g. integer counters) must be equal across models; they are copied.
    """
    check_same_keys(sds)
    if weights is None:
        weights = [1.0] * len(sds)
    if len(weights) != len(sds) or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"soup: need {len(sds)} non-negative weights with a positive sum, got {weights}")
    total = float(sum(weights))
    out = {}
    for k, ref in sds[0].items():
        if keys is not None and k not in keys:
            continue
        if not ref.is_floating_point():
            if any(not torch.equal(sd[k], ref) for sd in sds[1:]):
                raise ValueError(f"soup: non-float entry '{k}' differs between models; cannot average")
            out[k] = ref.clone()
            continue
        acc = torch.zeros_like(ref)
        for w, sd in zip(weights, sds):
            acc += (w / total) * sd[k].to(ref.device, ref.dtype)
        out[k] = acc
    return out
