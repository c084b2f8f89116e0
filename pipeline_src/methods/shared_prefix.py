"""Several tuned models of one method evaluated from one frozen-prefix pass.

Shard models of one method share their frozen prefix (`TunedModel.prefix`: the backbone blocks
before the tuned ones, or every block output a LAST side network reads; the feature caches rely on
the same fact). An ensemble of N of them therefore runs the prefix once per batch and only each
model's `forward_from_prefix`, instead of N whole forwards: for LAST the backbone runs once, not N
times. Their frozen tensors are shared too, so N loaded models hold one copy of the backbone.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def share_frozen_tensors(models: Sequence[nn.Module]) -> int:
    """Point every frozen tensor of models[1:] at models[0]'s equal tensor of the same name.

    Only parameters that do not train (`requires_grad` False) and buffers are shared, and only
    where the values are equal, so no model changes. Returns the number of elements freed.
    """
    if len(models) < 2:
        return 0
    first = models[0]
    ref = {**dict(first.named_parameters()), **dict(first.named_buffers())}
    freed = 0
    for model in models[1:]:
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            r = ref.get(name)
            if (r is None or t is r or t.data_ptr() == r.data_ptr() or t.requires_grad or r.requires_grad or t.shape != r.shape
                    or t.dtype != r.dtype or t.device != r.device or not torch.equal(t, r)):
                continue
            t.data = r.data  # the same storage; the copy is freed with its last reference
            freed += t.numel()
    return freed


@torch.no_grad()
def member_logits(models: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Each model's logits on the images x, from one prefix pass: (B, len(models), classes).

    Args:
        models: tuned models of one method and backbone (their prefixes are the same function).
        x: normalised images (B, C, H, W).
    """
    h = models[0].prefix(x)
    return torch.stack([m.forward_from_prefix(h) for m in models], dim=1)
