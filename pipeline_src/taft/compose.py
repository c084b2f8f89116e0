"""Composition and removal of tangent models by arithmetic on Δw.

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and
Removal", ICLR 2024. Tangent models sharing one linearization point w are linear
in Δw, so for weights λ_i with Σλ_i = 1

    f_w + J·(Σ λ_i Δ_i) = Σ λ_i (f_w + J·Δ_i),

i.e. composing the weight deltas equals ensembling the outputs. Removing shard j
(unlearning) subtracts λ_j Δ_j and rescales the remaining weights so they keep
their original total: exactly the composition of the other N−1 shards.
"""
from __future__ import annotations

from typing import Sequence

import torch

from pipeline_src.fusion.soup import weighted_average


def check_same_linearization(ids: Sequence[str]) -> str:
    """Return the common linearization id, or raise ValueError listing the mismatches.

    Args:
        ids: `TangentViT.linearization_id()` of every model to compose.
    """
    ids = list(ids)
    if not ids:
        raise ValueError("check_same_linearization: no ids given")
    bad = [(i, x) for i, x in enumerate(ids) if x != ids[0]]
    if bad:
        raise ValueError(f"tangent models have different linearization points: id[0]={ids[0][:12]}…, "
                         + ", ".join(f"id[{i}]={x[:12]}…" for i, x in bad[:5]))
    return ids[0]


def compose_deltas(delta_sds: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """Weighted sum Σ_i weights[i]·Δ_i, key by key.

    Weights summing to 1 make the result equal the weighted ensemble of the models'
    logits (for jvp_only models any weights do).

    Args:
        delta_sds: `delta_state_dict()` of each model; identical keys and shapes.
        weights: one weight per state dict.
    """
    return weighted_average(delta_sds, weights, normalize=False, what="compose_deltas")


def remaining_weights(weights: Sequence[float], index: int) -> list[float]:
    """Weights of the N−1 remaining components after removing `index`, rescaled to keep
    the original total Σ weights (e.g. 1/N each → 1/(N−1) each).

    Args:
        weights: the N composition weights.
        index: the removed component.
    """
    total, w_j = float(sum(weights)), float(weights[index])
    rest = total - w_j
    if abs(rest) < 1e-12 * max(1.0, abs(total)):
        raise ValueError("remaining_weights: the remaining weights sum to zero; nothing to renormalize")
    return [float(w) * total / rest for i, w in enumerate(weights) if i != index]


def subtract_component(composed: dict[str, torch.Tensor], component_sd: dict[str, torch.Tensor],
                       weights: Sequence[float], index: int, renormalize: bool = True) -> dict[str, torch.Tensor]:
    """Remove component `index` from Σ_i weights[i]·Δ_i.

    Returns (composed − w_j Δ_j)·S/(S − w_j) with S = Σ weights, which equals
    `compose_deltas(others, remaining_weights(weights, index))`; with renormalize=False
    just composed − w_j Δ_j.

    Args:
        composed: the N-composition.
        component_sd: Δ_j of the removed component.
        weights: the N weights used to compose.
        index: j, the position of the removed component in `weights`.
        renormalize: rescale the remainder to the original total weight.
    """
    if not 0 <= index < len(weights):
        raise IndexError(f"subtract_component: index {index} out of range for {len(weights)} weights")
    total, w_j = float(sum(weights)), float(weights[index])
    scale = 1.0
    if renormalize:
        if abs(total - w_j) < 1e-12 * max(1.0, abs(total)):
            raise ValueError("subtract_component: the remaining weights sum to zero; nothing to renormalize")
        scale = total / (total - w_j)
    return weighted_average([composed, component_sd], [scale, -w_j * scale], normalize=False,
                            what="subtract_component")
