"""Split a timm VisionTransformer into a frozen prefix and a trainable tail.

The prefix (patch embedding, positional embedding and the first `start` blocks) runs once
per image, so its output can be cached; the tail (the remaining blocks, final norm, pooling
and head) is what fine-tuning methods train.
"""
from __future__ import annotations

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn


def embed_tokens(model: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    """Images (B, C, H, W) → tokens (B, N, D) before the first block."""
    x = model.patch_embed(x)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    return model.norm_pre(x)


def vit_prefix(model: VisionTransformer, x: torch.Tensor, start: int) -> torch.Tensor:
    """Tokens (B, N, D) after the first `start` blocks."""
    h = embed_tokens(model, x)
    for blk in model.blocks[:start]:
        h = blk(h)
    return h


def vit_tail(model: VisionTransformer, h: torch.Tensor, start: int) -> torch.Tensor:
    """Logits from the tokens entering block `start` (blocks[start:], norm, pool, head)."""
    for blk in model.blocks[start:]:
        h = blk(h)
    return model.forward_head(model.norm(h))


def reinit_all(model: VisionTransformer, seed: int) -> None:
    """Re-initialise every parameter from `seed` (a from-scratch model of the backbone's architecture):
    each module's own `reset_parameters` (LayerNorm, the patch convolution), then timm's ViT init
    (truncated-normal linears, position embedding and CLS token).

    Args:
        model: the ViT, changed in place.
        seed: the init seed (the head seed: every shard starts from the same random model).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in model.modules():
            if module is not model and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        model.init_weights()


def reset_head(model: VisionTransformer, num_classes: int, seed: int) -> None:
    """Replace the classifier by a fresh `num_classes` head, initialised from `seed` only.

    Every shard of a study uses the same seed, so all shard models start from one head (which
    soups need, and which TAFT's shared linearization point requires).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.reset_classifier(num_classes)


class FromPrefix(nn.Module):
    """`forward(h) = tuned.forward_from_prefix(h)`: a tuned model fed its cached prefix output,
    as one module for code that wraps a module's forward (Opacus, `torch.func.functional_call`,
    the fusion library's hooks and per-example gradients).

    Args:
        tuned: a model with `forward_from_prefix` (TailFineTune, TangentViT, a tuned side network).
        root: None registers `tuned` as the submodule `tuned` (parameters `tuned.<name>`); an
            attribute name registers only `getattr(tuned, root)`, as `root`, so each of its
            tensors is named once, `root.<key>` (the fusion study's trained part).
    """

    def __init__(self, tuned: nn.Module, root: str | None = None) -> None:
        super().__init__()
        if root is None:
            self.tuned = tuned
        else:
            self.root = getattr(tuned, root)
            self.__dict__["tuned"] = tuned  # not a submodule: its parameters are named under root only

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.tuned.forward_from_prefix(h)
