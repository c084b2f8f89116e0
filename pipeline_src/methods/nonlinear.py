"""Non-linear fine-tuning baselines: `fc` (head only), `nlft` (last k blocks, final norm and
head) and `full` (every parameter).

NLFT is the non-linear counterpart that TAFT is compared with in Liu & Soatto et al.,
"Tangent Transformers for Composition, Privacy and Removal" (ICLR 2024), Table 1.
"""
from __future__ import annotations

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pipeline_src.vit.parts import vit_prefix, vit_tail


class TailFineTune(nn.Module):
    """A ViT whose first `depth - k` blocks are frozen (and cacheable) and whose tail trains.

    Args:
        model: the backbone with its downstream head already in place.
        k: tuned blocks; 0 tunes only the head (`fc`).
        full: train every parameter, embeddings included (`full`); the prefix is then empty.
    """

    def __init__(self, model: VisionTransformer, k: int, full: bool = False) -> None:
        super().__init__()
        depth = len(model.blocks)
        if not 0 <= k <= depth:
            raise ValueError(f"k={k}: must be between 0 and the backbone depth {depth}")
        self.model = model
        self.start = 0 if full else depth - k
        self.full = full
        for p in model.parameters():
            p.requires_grad_(full)
        if not full:
            tail = [model.head] if k == 0 else [*model.blocks[self.start:], model.norm, model.fc_norm, model.head]
            tail += [model.head_dist] if isinstance(getattr(model, "head_dist", None), nn.Module) else []  # DeiT distilled
            for module in tail:
                for p in module.parameters():
                    p.requires_grad_(True)

    @torch.no_grad()
    def prefix(self, x: torch.Tensor) -> torch.Tensor:
        """Frozen features (B, N, D) entering the first tuned block; images when `full`."""
        return x if self.full else vit_prefix(self.model, x, self.start)

    def forward_from_prefix(self, h: torch.Tensor) -> torch.Tensor:
        if self.full:
            return self.model(h)
        return vit_tail(self.model, h, self.start)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_from_prefix(self.prefix(x))

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trained tensors, keyed by their name in the backbone."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        expected = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if set(state) != expected:
            raise ValueError(f"trained state keys differ from the method's: missing {sorted(expected - set(state))[:3]}, "
                             f"unexpected {sorted(set(state) - expected)[:3]}")
        self.model.load_state_dict(state, strict=False)
