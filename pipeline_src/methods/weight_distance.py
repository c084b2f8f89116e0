"""How far fine-tuning moved a model: the L2 distance of its trained tensors from their starting
values, the quantity of Fig. 4 of Liu, Soatto et al., "Tangent Transformers for Composition,
Privacy and Removal", ICLR 2024 (distance of the fine-tuned weights from the pre-trained ones).

The start is the model `build_tuned_model` makes from the same backbone, method settings and head
seed: the pretrained backbone weights for nlft/full, Δw = 0 (up to its 1e-12-scale init) for
taft, where the distance is ‖Δw‖, and the seeded initial head or side network for new parts.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from pipeline_src.data.backbone import load_backbone
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.store.model_io import load_model


def state_distance(state: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """sqrt(Σ_k ‖state[k] − start[k]‖²) over the keys of `state`, in float64.

    Raises:
        KeyError: a tensor of `state` that `start` lacks, named.
    """
    missing = sorted(set(state) - set(start))
    if missing:
        raise KeyError(f"weight distance: the starting model lacks {missing[:5]}")
    total = sum(float((state[k].double().cpu() - start[k].double().cpu()).square().sum()) for k in state)
    return total ** 0.5


def distance_from_start(backbone_dir: str | Path, weights_path: str | Path, backbone=None,
                        starts: dict | None = None) -> float:
    """The L2 distance of a trained (or composed) model's tensors from their starting values.

    Args:
        backbone_dir: folder of the pretrained backbone (`load_backbone`).
        weights_path: the model's `.safetensors` file (with its record beside it).
        backbone: `load_backbone(backbone_dir)`, already loaded; it is copied, not changed.
        starts: a cache of starting states that several calls of one job share (a method's shard
            models share one start: one head seed), keyed by method settings, classes and head
            seed; each start is then built once, not once per model.
    """
    state, record = load_model(weights_path)
    key = (json.dumps(record["method_config"], sort_keys=True), record["num_classes"], record["head_seed"])
    if starts is None or key not in starts:
        loaded, _ = backbone or load_backbone(backbone_dir)
        start = build_tuned_model(loaded, record["method_config"], record["num_classes"], record["head_seed"])
        if starts is None:
            return state_distance(state, start.trainable_state())
        starts[key] = start.trainable_state()
    return state_distance(state, starts[key])
