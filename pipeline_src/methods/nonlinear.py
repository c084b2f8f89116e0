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

CLS_RESET_STD = 0.02  # as TAFT's reset CLS token (taft/tangent_vit.py: timm's 1e-6 init is degenerate there)


class TailFineTune(nn.Module):
    """A ViT whose first `depth - k` blocks are frozen (and cacheable) and whose tail trains.

    Args:
        model: the backbone with its downstream head already in place.
        k: tuned blocks; 0 tunes only the head (`fc`).
        full: train every parameter, embeddings included (`full`); the prefix is then empty.
    """

    def __init__(self, model: VisionTransformer, k: int, full: bool = False, reset_cls: bool = False,
                 seed: int = 0) -> None:
        super().__init__()
        depth = len(model.blocks)
        if not 0 <= k <= depth:
            raise ValueError(f"k={k}: must be between 0 and the backbone depth {depth}")
        if reset_cls and (full or k == 0 or not getattr(model, "has_class_token", False)):
            raise ValueError("nlft reset_cls (CLS = T): needs tuned blocks (k >= 1, not full) and a class token")
        self.model = model
        self.start = 0 if full else depth - k
        self.full = full
        self.reset_cls = bool(reset_cls)
        for p in model.parameters():
            p.requires_grad_(full)
        if not full:
            tail = [model.head] if k == 0 else [*model.blocks[self.start:], model.norm, model.fc_norm, model.head]
            tail += [model.head_dist] if isinstance(getattr(model, "head_dist", None), nn.Module) else []  # DeiT distilled
            for module in tail:
                for p in module.parameters():
                    p.requires_grad_(True)
        if self.reset_cls:
            # CLS = T (TAFT paper Table 4 searched it for NLFT-1 too): the class-token row entering the
            # tuned blocks is a trained token, started as TAFT's reset token (N(0, 0.02²), seed + 2), the
            # non-linear twin of TAFT's `reset_cls`. An Embedding, so DP's per-sample gradients see it.
            width = model.cls_token.shape[-1]
            start = torch.randn((1, width), generator=torch.Generator().manual_seed(int(seed) + 2),
                                dtype=torch.float64) * CLS_RESET_STD
            model.tail_cls = nn.Embedding(1, width, device=model.cls_token.device, dtype=model.cls_token.dtype)
            with torch.no_grad():
                model.tail_cls.weight.copy_(start.to(model.tail_cls.weight.dtype))

    @torch.no_grad()
    def prefix(self, x: torch.Tensor) -> torch.Tensor:
        """Frozen features (B, N, D) entering the first tuned block; images when `full`."""
        return x if self.full else vit_prefix(self.model, x, self.start)

    def forward_from_prefix(self, h: torch.Tensor) -> torch.Tensor:
        if self.full:
            return self.model(h)
        if self.reset_cls:  # the class-token row (index 0) replaced by the trained token
            token = self.model.tail_cls(torch.zeros(h.shape[0], 1, dtype=torch.long, device=h.device))  # (B, 1, D)
            h = torch.cat([token.to(h.dtype), h[:, 1:]], dim=1)
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
