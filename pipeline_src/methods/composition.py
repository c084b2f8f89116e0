"""Combining shard models.

- `soup`: the uniform average of the shard models' trained weights (Wortsman et al., "Model
  soups", ICML 2022) by `fusion.soup.weighted_average`; one model, constant inference cost.
- `ensemble`: the average of the shard models' logits, the SISA baseline (Bourtoule et al.,
  "Machine Unlearning", IEEE S&P 2021); inference cost grows with the shard count.
- `subtract_shards`: the inverse for tangent models, forgetting shards without training (TAFT,
  Liu, Soatto et al., ICLR 2024, §3.3).
"""
from __future__ import annotations

from typing import Sequence

import torch

from pipeline_src.plan.forget import ForgetRequestError
from pipeline_src.taft.compose import remaining_weights, subtract_component


def composition_weights(records: list[dict], scheme: str) -> list[float]:
    """`uniform`, or proportional to each shard's number of training samples (`size`).

    Args:
        records: the shard models' records, in composition order.
        scheme: config key `compose_weights`.
    """
    if scheme == "size":
        sizes = [r["num_samples"] for r in records]
        return [s / sum(sizes) for s in sizes]
    return [1.0 / len(records)] * len(records)


def ensemble_logits(logits: list[torch.Tensor], weights: Sequence[float] | None = None) -> torch.Tensor:
    """SISA-style aggregation: the (weighted) mean of the component models' logits.

    Args:
        logits: one (n, classes) tensor per component.
        weights: composition weights (`composition_weights`), rescaled to sum to 1; None: uniform.
            With the soup's weights the ensemble of tangent models equals their Δw sum.
    """
    if weights is None:
        return torch.stack(logits).mean(0)
    if len(weights) != len(logits):
        raise ValueError(f"ensemble_logits: {len(weights)} weights for {len(logits)} components")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    w = (w / w.sum()).to(logits[0].dtype)
    return torch.einsum("k,k...->...", w, torch.stack(logits))  # Σ_k w_k · logits_k


def subtract_shards(composed: dict, components: dict[int, dict], weights: Sequence[float], shard_ids: Sequence[int],
                    remove: Sequence[int]) -> tuple[dict, list[int], list[float]]:
    """TAFT-subtract: remove shards from a composed tangent model, one at a time, renormalising.

    Each step is `taft.compose.subtract_component`, so the result equals composing the kept
    shards directly with `remaining_weights` (proportional to their original weights).

    Args:
        composed: Σ_i w_i Δ_i of the shards `shard_ids`.
        components: Δ_j of (at least) every removed shard j.
        weights: w_i, aligned with `shard_ids`.
        shard_ids: the composed shards, in the order of `weights`.
        remove: the shards to remove.
    Returns:
        (the new composed Δ, the kept shard ids, their weights).
    """
    alive, w, state = list(shard_ids), [float(x) for x in weights], composed
    for j in remove:
        if j not in alive:
            raise ForgetRequestError(f"subtract_shards: shard {j} is not a component of the composed model")
        idx = alive.index(j)
        state = subtract_component(state, components[j], w, idx)
        w = remaining_weights(w, idx)
        alive.pop(idx)
    return state, alive, w
