"""Which parameters train under DP: full | bitfit | layernorm | fc.

Smaller trainable sets lower the DP noise dimension; BitFit (Ben Zaken et al. 2022,
"BitFit: simple parameter-efficient fine-tuning") trains biases only, and the
layer-norm and head-only regimes are the usual private transfer baselines
(Liu & Soatto 2024, "Tangent Transformers...", §3.4 and its DP tables).
Generic over module trees: parameters are selected by module type, never by name.
"""
from __future__ import annotations

from typing import Sequence

from torch import nn

REGIMES = ("full", "bitfit", "layernorm", "fc")


def nlft_scope(vit: nn.Module, k: int = 1) -> list[nn.Module]:
    """Trainable scope of NLFT-k on a timm VisionTransformer: last k blocks, final norms, head.

    Args:
        vit: a timm VisionTransformer (needs `blocks`, `norm`, `head`; `fc_norm` if present).
        k: number of trailing blocks.
    """
    for attr in ("blocks", "norm", "head"):
        if not hasattr(vit, attr):
            raise ValueError(f"nlft_scope: {type(vit).__qualname__} has no attribute '{attr}'")
    if not 1 <= k <= len(vit.blocks):
        raise ValueError(f"nlft_scope: k={k} outside 1..{len(vit.blocks)}")
    extra = [vit.fc_norm] if isinstance(getattr(vit, "fc_norm", None), nn.LayerNorm) else []
    return [*vit.blocks[-k:], vit.norm, *extra, vit.head]


def _last_linear(scope: Sequence[nn.Module]) -> nn.Linear:
    linears = [m for s in scope for m in s.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("regime 'fc': the trainable scope holds no nn.Linear to use as the head")
    return linears[-1]


def apply_regime(model: nn.Module, regime: str, trainable_scope: Sequence[nn.Module],
                 head: nn.Module | None = None) -> list[str]:
    """Freeze `model`, then unfreeze the regime's parameters inside `trainable_scope`.

    Args:
        model: the whole model (everything outside the scope is frozen).
        regime: "full" (every parameter in the scope), "bitfit" (the `bias` parameter of
            every module in the scope), "layernorm" (LayerNorm γ and β in the scope),
            "fc" (the head only).
        trainable_scope: modules of `model`, ordered input to output.
        head: the head for "fc"; default: the last nn.Linear of the scope.
    Returns:
        Names (in `model`) of the parameters left trainable.
    """
    if regime not in REGIMES:
        raise ValueError(f"unknown DP regime {regime!r}; choose one of {REGIMES}")
    owned = {id(m) for m in model.modules()}
    for s in trainable_scope:
        if id(s) not in owned:
            raise ValueError(f"trainable scope module {type(s).__qualname__} is not part of the model")
    model.requires_grad_(False)
    if regime == "full":
        for s in trainable_scope:
            s.requires_grad_(True)
    elif regime == "fc":
        (head if head is not None else _last_linear(trainable_scope)).requires_grad_(True)
    else:
        for s in trainable_scope:
            for m in s.modules():
                if regime == "layernorm" and isinstance(m, nn.LayerNorm):
                    m.requires_grad_(True)
                elif regime == "bitfit" and isinstance(getattr(m, "bias", None), nn.Parameter):
                    m.bias.requires_grad_(True)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not names:
        raise ValueError(f"regime {regime!r} left no trainable parameter in the scope")
    return names
