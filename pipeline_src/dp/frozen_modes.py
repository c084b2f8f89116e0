"""Train mode for the trainable part only: a module that holds no trainable parameter (in
itself or below) is frozen, and stays in eval mode while the rest trains.

A frozen BatchNorm stem in train mode would update its running statistics (and normalise by the
batch's), and frozen dropout or drop-path would perturb the prefix: either moves the model's
function and its `linearization_id` away from the public backbone. `train_tangent` keeps the
whole model in eval mode; the DP trainers need train mode on the trainable modules (Opacus
captures activations only there), so they use this.
"""
from __future__ import annotations

from torch import nn


def train_trainable_only(model: nn.Module) -> nn.Module:
    """Put the modules holding a trainable parameter in train mode and every other in eval mode.

    Args:
        model: the model about to be trained (its `requires_grad` flags already set).
    Returns:
        model.
    """
    for module in model.modules():
        module.training = any(p.requires_grad for p in module.parameters())
    return model
