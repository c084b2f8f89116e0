"""Combining shard models.

- `soup`: the uniform average of the shard models' trained weights (Wortsman et al., "Model
  soups", ICML 2022); one model, constant inference cost.
- `ensemble`: the average of the shard models' logits, the SISA baseline (Bourtoule et al.,
  "Machine Unlearning", IEEE S&P 2021); inference cost grows with the shard count.
"""
from __future__ import annotations

import torch


def average_states(states: list[dict[str, torch.Tensor]], weights: list[float] | None = None) -> dict[str, torch.Tensor]:
    """Weighted average of state dicts with identical keys and shapes (uniform by default)."""
    if not states:
        raise ValueError("nothing to average: no component models")
    keys = set(states[0])
    for i, s in enumerate(states[1:], 1):
        if set(s) != keys:
            raise ValueError(f"component {i} has different tensors: {sorted(keys ^ set(s))[:3]}")
    weights = [1.0 / len(states)] * len(states) if weights is None else weights
    if len(weights) != len(states):
        raise ValueError(f"{len(weights)} weights for {len(states)} models")
    return {k: sum(w * s[k].double() for w, s in zip(weights, states)).to(states[0][k].dtype) for k in states[0]}


def ensemble_logits(logits: list[torch.Tensor]) -> torch.Tensor:
    """SISA-style aggregation: the mean of the component models' logits."""
    return torch.stack(logits).mean(0)
