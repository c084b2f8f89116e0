"""The book-keeping rules: per module type, per-example squared gradient norms and the clipped
gradient sum from one call's records (activations, output gradient); `book_keeping.py` and the
first step's probe (`first_step_probe.py`) both read them. The rules are listed in
`book_keeping.py`'s docstring (Bu et al., ICML 2023).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pipeline_src.dp.additive import AdditiveDelta, additive_delta_grad_sample
from pipeline_src.dp.module_type_registry import module_type_registrar
from pipeline_src.dp.norm_samplers import _as_tokens, _layer_norm_types, linear_weight_sq_norm

Clip = Callable[[torch.Tensor], dict[nn.Parameter, torch.Tensor]]
# rule(module, activations, backprops) -> ({param: squared per-example norm (B,)}, clip)
# where clip(coef (B,)) -> {param: Σ_i coef_i ∇_param ℓ_i}
BkRule = Callable[[nn.Module, list[torch.Tensor], torch.Tensor], tuple[dict[nn.Parameter, torch.Tensor], Clip]]
BK_RULES: dict[type, BkRule] = {}


# register_bk_rule(*module_types): file a rule under exact module types; duplicates are refused.
register_bk_rule = module_type_registrar(BK_RULES, "book-keeping rule")


def _per_example_rule(per_ex: dict[nn.Parameter, torch.Tensor], norms: dict | None = None,
                      extra: Clip | None = None) -> tuple[dict[nn.Parameter, torch.Tensor], Clip]:
    """Rule output from small per-example gradients {param: (B, *param.shape)}: norms and a
    clip that contracts them with the coefficients (plus `extra` clipped terms)."""
    norms = dict(norms or {})
    for p, gs in per_ex.items():
        if p not in norms:
            norms[p] = _rows_sq(gs)

    def clip(coef: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        out = {p: (coef.to(gs.dtype) @ gs.reshape(gs.shape[0], -1)).view_as(p) for p, gs in per_ex.items()}
        if extra is not None:
            out.update(extra(coef))
        return out
    return norms, clip


def _rows_sq(x: torch.Tensor) -> torch.Tensor:
    """Squared norm of each example's slice, (B,), as one reduction (no squared copy of x)."""
    return torch.linalg.vector_norm(x.reshape(x.shape[0], -1), dim=1).square()


def _scale(g: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    return g * coef.to(g.dtype).view(-1, *([1] * (g.dim() - 1)))


@register_bk_rule(nn.Linear)
def linear_bk(layer: nn.Linear, activations: list[torch.Tensor], backprops: torch.Tensor):
    """nn.Linear: vector / Gram norms with a clipped GEMM, or direct per-example gradients."""
    g = _as_tokens(backprops)
    b, t, d_out = g.shape
    per_ex: dict[nn.Parameter, torch.Tensor] = {}
    norms: dict[nn.Parameter, torch.Tensor] = {}
    extra: Clip | None = None
    gsq = _rows_sq(g) if t == 1 else None  # vectors: ‖g_i‖² serves the weight and the bias
    if layer.weight.requires_grad:
        a = _as_tokens(activations[0].to(g.dtype))
        d_in = a.shape[2]
        if t > 1 and t * (d_in + d_out) > d_in * d_out:  # direct: (B, d_out, d_in) is smaller than a and g
            per_ex[layer.weight] = torch.bmm(g.transpose(1, 2), a)
        else:  # vectors (T = 1): ‖a_i‖²‖g_i‖²; tokens: Gram form
            norms[layer.weight] = _rows_sq(a) * gsq if t == 1 else linear_weight_sq_norm(a, g, "gram")

            def extra(coef: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
                # Σ_i c_i g_iᵀ a_i as one GEMM; the smaller operand takes the scaling copy
                if d_out <= d_in:
                    return {layer.weight: _scale(g, coef).reshape(-1, d_out).t().mm(a.reshape(-1, d_in))}
                return {layer.weight: g.reshape(-1, d_out).t().mm(_scale(a, coef).reshape(-1, d_in))}
    if layer.bias is not None and layer.bias.requires_grad:
        per_ex[layer.bias] = g.reshape(b, d_out) if t == 1 else g.sum(1)
        if gsq is not None:
            norms[layer.bias] = gsq
    return _per_example_rule(per_ex, norms, extra)


@register_bk_rule(*_layer_norm_types())
def layer_norm_bk(layer: nn.LayerNorm, activations: list[torch.Tensor], backprops: torch.Tensor):
    """LayerNorm affine: per-example γ grad Σ_t g ⊙ x̂ and β grad Σ_t g, (B, *normalized_shape)."""
    g = backprops
    sum_dims = tuple(range(1, g.dim() - len(layer.normalized_shape)))
    per_ex: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight is not None and layer.weight.requires_grad:
        xhat = F.layer_norm(activations[0].to(g.dtype), layer.normalized_shape, eps=layer.eps)
        per_ex[layer.weight] = (g * xhat).sum(sum_dims) if sum_dims else g * xhat
    if layer.bias is not None and layer.bias.requires_grad:
        per_ex[layer.bias] = g.sum(sum_dims) if sum_dims else g
    return _per_example_rule(per_ex)


@register_bk_rule(AdditiveDelta)
def additive_delta_bk(layer: AdditiveDelta, activations: list[torch.Tensor], backprops: torch.Tensor):
    """AdditiveDelta: per-example grad = g summed over the broadcast dims."""
    per_ex = {layer.delta: additive_delta_grad_sample(layer.delta, backprops)} if layer.delta.requires_grad else {}
    return _per_example_rule(per_ex)


@register_bk_rule(nn.Embedding)
def embedding_bk(layer: nn.Embedding, activations: list[torch.Tensor], backprops: torch.Tensor):
    """nn.Embedding: norms from the same-index Gram of g; clipped sum by index_add."""
    if not layer.weight.requires_grad:
        return _per_example_rule({})
    idx = activations[0].reshape(activations[0].shape[0], -1)  # (B, T)
    g = backprops.reshape(idx.shape[0], idx.shape[1], -1)  # (B, T, D)
    if layer.padding_idx is not None:  # the padding row gets no gradient
        g = g * (idx != layer.padding_idx).unsqueeze(-1).to(g.dtype)
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)  # (B, T, T)
    sq = (torch.bmm(g, g.transpose(1, 2)) * same).sum((1, 2)).clamp(min=0)

    def extra(coef: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        gc = _scale(g, coef).reshape(-1, g.shape[-1])
        return {layer.weight: torch.zeros_like(layer.weight).index_add_(0, idx.reshape(-1), gc.to(layer.weight.dtype))}
    return _per_example_rule({}, {layer.weight: sq}, extra)


def _scale_bk(param_name: str):
    def rule(layer: nn.Module, activations: list[torch.Tensor], backprops: torch.Tensor):
        p = getattr(layer, param_name)
        if not p.requires_grad:
            return _per_example_rule({})
        x = activations[0].to(backprops.dtype)
        return _per_example_rule({p: (x * backprops).reshape(x.shape[0], -1, x.shape[-1]).sum(1)})
    rule.__name__ = f"scale_bk_{param_name}"
    return rule


try:  # timm's LayerScale (γ ⊙ x over the last dim)
    from timm.layers import LayerScale as _TimmLayerScale
    register_bk_rule(_TimmLayerScale)(_scale_bk("gamma"))
except ImportError:  # pragma: no cover
    _TimmLayerScale = None
try:  # TAFT's Δγ of a LayerScale
    from pipeline_src.taft.jvp_layers import DeltaScale as _DeltaScale
    register_bk_rule(_DeltaScale)(_scale_bk("weight"))
except ImportError:  # pragma: no cover
    _DeltaScale = None
