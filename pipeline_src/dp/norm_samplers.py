"""Fast squared per-example gradient norms, never materialising per-example gradients
where a cheaper form exists, plugged into Opacus' ghost-clipping hooks.

Methods:
- Linear on token sequences (B, T, d): the Gram form ‖∇W_i‖² = ⟨a_i a_iᵀ, g_i g_iᵀ⟩
  (Li et al. 2022, "Large language models can be strong differentially private learners",
  ghost clipping; Lee & Kifer 2021, "Scaling up differentially private deep learning with
  fast per-example gradient clipping"), or the direct form ‖g_iᵀ a_i‖² when
  T·(d_in+d_out) > d_in·d_out; for vectors (B, d) the fast path ‖a_i‖²‖g_i‖²
  (Goodfellow 2015; Lee & Kifer 2021). Bias: ‖Σ_t g_it‖².
- LayerNorm affine: per-example γ grad Σ_t g⊙x̂ and β grad Σ_t g, Θ(B·T·c)
  (Lee & Kifer 2021, per-layer rules).
- AdditiveDelta: per-example grad = g summed over the broadcast dims.
- timm LayerScale (γ ⊙ x, Touvron et al. 2021, "Going deeper with image transformers")
  and TAFT's DeltaScale (its Δγ): per-example γ grad Σ_t x ⊙ g, Θ(B·T·c), the diagonal
  case of the Linear rule (Lee & Kifer 2021, per-layer rules).
DP-TAFT (Liu & Soatto 2024, "Tangent Transformers for composition, privacy and removal",
§3.4) trains Δ parameters held in exactly these module types.

Registration: `register_fast_norm_sampler` keeps our own registry and refuses duplicates.
We do not overwrite Opacus' global `NORM_SAMPLERS` (its nn.Linear entry is the "ghost"
baseline we compare against); `attach_fast_norm_samplers` installs the merged table on
one wrapped module instance, whose hooks look it up as `self.NORM_SAMPLERS`.
"""
from __future__ import annotations

from typing import Callable, Literal

import torch
import torch.nn.functional as F
from opacus.grad_sample import GradSampleHooksFastGradientClipping, GradSampleModuleFastGradientClipping
from torch import nn

from pipeline_src.dp.additive import AdditiveDelta, additive_delta_grad_sample
from pipeline_src.dp.module_type_registry import module_type_registrar
from pipeline_src.taft.jvp_layers import DeltaScale

# fn(module, activations, backprops) -> {param: squared per-example norm, shape (B,)}
SqNormFn = Callable[[nn.Module, list[torch.Tensor], torch.Tensor], dict[nn.Parameter, torch.Tensor]]
FAST_SQ_NORM_SAMPLERS: dict[type, SqNormFn] = {}
LinearMethod = Literal["auto", "gram", "direct"]


# register_fast_norm_sampler(*module_types): file a squared-norm sampler under exact module
# types (matched by exact type, as Opacus does); duplicates are refused.
register_fast_norm_sampler = module_type_registrar(FAST_SQ_NORM_SAMPLERS, "fast norm sampler")


def _as_tokens(t: torch.Tensor) -> torch.Tensor:
    """(B, *, d) -> (B, T, d) with T the product of the middle dims (1 for vectors)."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


def linear_weight_sq_norm(a: torch.Tensor, g: torch.Tensor, method: LinearMethod = "auto") -> torch.Tensor:
    """Squared per-example norm of ∇W = Σ_t g_t a_tᵀ for activations a (B, T, d_in)
    and output grads g (B, T, d_out).

    Args:
        a: layer inputs, (B, T, d_in).
        g: output gradients, (B, T, d_out).
        method: "gram" ⟨aaᵀ, ggᵀ⟩ costs B·T²·(d_in+d_out) and B·T² memory; "direct" builds
            the per-example gradient, B·T·d_in·d_out and B·d_in·d_out memory; "auto" picks
            the cheaper (vectors, T = 1, use ‖a‖²‖g‖²).
    """
    t, d_in, d_out = a.shape[1], a.shape[2], g.shape[2]
    if t == 1 and method == "auto":
        return a.pow(2).sum((1, 2)) * g.pow(2).sum((1, 2))
    if method == "auto":
        method = "gram" if t * (d_in + d_out) <= d_in * d_out else "direct"
    if method == "gram":
        aat = torch.bmm(a, a.transpose(1, 2))  # (B, T, T)
        ggt = torch.bmm(g, g.transpose(1, 2))  # (B, T, T)
        return (aat * ggt).sum((1, 2)).clamp(min=0)
    if method == "direct":
        return torch.bmm(g.transpose(1, 2), a).pow(2).sum((1, 2))  # (B, d_out, d_in) summed
    raise ValueError(f"unknown linear norm method {method!r}; use 'auto', 'gram' or 'direct'")


@register_fast_norm_sampler(nn.Linear)
def linear_sq_norms(layer: nn.Linear, activations: list[torch.Tensor], backprops: torch.Tensor,
                    method: LinearMethod = "auto") -> dict[nn.Parameter, torch.Tensor]:
    """Squared per-example gradient norms of an nn.Linear's weight and bias.

    Args:
        layer: the linear layer.
        activations: [input], (B, *, d_in).
        backprops: output gradient, (B, *, d_out), already scaled per example.
        method: see `linear_weight_sq_norm`.
    """
    g = _as_tokens(backprops)
    out: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight.requires_grad:
        out[layer.weight] = linear_weight_sq_norm(_as_tokens(activations[0].to(g.dtype)), g, method)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = g.sum(1).pow(2).sum(-1)  # ‖Σ_t g_t‖², no T² Gram needed
    return out


def _layer_norm_types() -> tuple[type, ...]:
    types: tuple[type, ...] = (nn.LayerNorm,)
    try:  # timm's LayerNorm subclasses nn.LayerNorm; Opacus matches exact types
        from timm.layers import LayerNorm as TimmLayerNorm
        types += (TimmLayerNorm,)
    except ImportError:
        pass
    return types


@register_fast_norm_sampler(*_layer_norm_types())
def layer_norm_sq_norms(layer: nn.LayerNorm, activations: list[torch.Tensor],
                        backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Squared per-example norms of a LayerNorm's γ (Σ_t g⊙x̂) and β (Σ_t g).

    Args:
        layer: the LayerNorm.
        activations: [input], (B, *, *normalized_shape).
        backprops: output gradient, same shape as the input.
    """
    g = backprops
    b = g.shape[0]
    sum_dims = tuple(range(1, g.dim() - len(layer.normalized_shape)))  # token dims
    out: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight is not None and layer.weight.requires_grad:
        xhat = F.layer_norm(activations[0].to(g.dtype), layer.normalized_shape, eps=layer.eps)
        gw = (g * xhat).sum(sum_dims) if sum_dims else g * xhat
        out[layer.weight] = gw.reshape(b, -1).pow(2).sum(1)
    if layer.bias is not None and layer.bias.requires_grad:
        gb = g.sum(sum_dims) if sum_dims else g
        out[layer.bias] = gb.reshape(b, -1).pow(2).sum(1)
    return out


@register_fast_norm_sampler(AdditiveDelta)
def additive_delta_sq_norms(layer: AdditiveDelta, activations: list[torch.Tensor],
                            backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Squared per-example norm of an AdditiveDelta's delta.

    Args:
        layer: the AdditiveDelta module.
        activations: [input] (unused: the gradient does not depend on it).
        backprops: output gradient, (B, *x.shape[1:]).
    """
    if not layer.delta.requires_grad:
        return {}
    gs = additive_delta_grad_sample(layer.delta, backprops)
    return {layer.delta: gs.reshape(gs.shape[0], -1).pow(2).sum(1)}


def _layer_scale_types() -> tuple[type, ...]:
    types: tuple[type, ...] = (DeltaScale,)
    try:
        from timm.layers import LayerScale
        types += (LayerScale,)
    except ImportError:  # pragma: no cover
        pass
    return types


def _scale_param(layer: nn.Module) -> nn.Parameter:
    return layer.weight if isinstance(layer, DeltaScale) else layer.gamma


@register_fast_norm_sampler(*_layer_scale_types())
def layer_scale_sq_norms(layer: nn.Module, activations: list[torch.Tensor],
                         backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Squared per-example norm of a LayerScale's γ (or a DeltaScale's Δγ): ‖Σ_t x ⊙ g‖².

    Args:
        layer: timm ``LayerScale`` (y = γ ⊙ x) or TAFT's ``DeltaScale`` (y = Δγ ⊙ x).
        activations: [input], (B, *, c).
        backprops: output gradient, same shape.
    """
    p = _scale_param(layer)
    if not p.requires_grad:
        return {}
    g = _as_tokens(backprops)
    per_example = (_as_tokens(activations[0].to(g.dtype)) * g).sum(1)  # (B, c)
    return {p: per_example.pow(2).sum(1)}


def _opacus_format(fn: SqNormFn) -> Callable:
    """Opacus' norm samplers return norms, not squared norms."""
    def norm_sampler(module: nn.Module, activations: list[torch.Tensor], backprops: torch.Tensor):
        return {p: sq.clamp(min=0).sqrt() for p, sq in fn(module, activations, backprops).items()}
    norm_sampler.__name__ = f"opacus_{fn.__name__}"
    return norm_sampler


def check_fast_supported(model: nn.Module) -> None:
    """Raise if a module owning trainable parameters has no fast norm sampler (ours, or
    one of Opacus' own norm samplers such as nn.Embedding's).

    Args:
        model: the model about to be wrapped.
    Raises:
        NotImplementedError: naming the module type, its path and its trainable parameters.
    """
    for name, m in model.named_modules():
        own = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
        # Opacus' own true ghost samplers (nn.Embedding) are kept in the merged table
        if own and type(m) not in FAST_SQ_NORM_SAMPLERS and type(m) not in GradSampleHooksFastGradientClipping.NORM_SAMPLERS:
            raise NotImplementedError(
                f"no fast norm sampler for module type {type(m).__module__}.{type(m).__qualname__} "
                f"(module '{name or '<root>'}', trainable parameters {own}); freeze it, hold the parameter "
                f"in a supported module (nn.Linear, nn.LayerNorm, AdditiveDelta, LayerScale), register one "
                f"with register_fast_norm_sampler, or use mode='ghost'/'hooks'")
        if own and type(m) in _layer_scale_types() and getattr(m, "inplace", False):
            raise NotImplementedError(f"fast clipping: LayerScale '{name}' is in-place (inplace=True), "
                                      f"which overwrites the input its per-example norm needs")


def check_opacus_supported(model: nn.Module, mode: str) -> None:
    """Raise, naming the module, where Opacus' own per-sample gradients ("ghost", "hooks") would
    crash or record the wrong input: a trainable LayerNorm without a bias (its grad sampler reads
    `bias.requires_grad`: AttributeError) and an in-place LayerScale (`x.mul_(γ)` overwrites the
    recorded input: 2·C measured in ghost).

    Args:
        model: the model about to be wrapped.
        mode: the DP mode, named in the error.
    Raises:
        NotImplementedError: naming the module and the mode.
    """
    for name, m in model.named_modules():
        own = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if isinstance(m, nn.LayerNorm) and m.bias is None:
            raise NotImplementedError(f"DP mode {mode!r}: trainable LayerNorm '{name or '<root>'}' has no bias "
                                      f"(bias=False), which Opacus' LayerNorm grad sampler needs; use mode='fast' or "
                                      f"'bk', or freeze it")
        if type(m) in _layer_scale_types() and getattr(m, "inplace", False):
            raise NotImplementedError(f"DP mode {mode!r}: LayerScale '{name or '<root>'}' is in-place (inplace=True), "
                                      f"which overwrites the input its per-example gradient needs")


def attach_fast_norm_samplers(hooks: GradSampleHooksFastGradientClipping) -> None:
    """Make one Opacus ghost-clipping wrapper use our samplers (instance-level table that
    shadows the class-level registry; Opacus' own entries stay for other types).

    Args:
        hooks: a GradSampleModuleFastGradientClipping (or hooks object) built with ghost clipping.
    """
    if not isinstance(hooks, GradSampleHooksFastGradientClipping) or not hooks.use_ghost_clipping:
        raise TypeError(f"expected an Opacus ghost-clipping wrapper, got {type(hooks).__qualname__}")
    table = dict(GradSampleHooksFastGradientClipping.NORM_SAMPLERS)
    table.update({t: _opacus_format(fn) for t, fn in FAST_SQ_NORM_SAMPLERS.items()})
    hooks.NORM_SAMPLERS = table


def wrap_fast(model: nn.Module, *, max_grad_norm: float, loss_reduction: str = "mean") -> GradSampleModuleFastGradientClipping:
    """Wrap `model` for fast clipping with our norm samplers (checks coverage first).

    Args:
        model: model whose trainable parameters all live in supported module types.
        max_grad_norm: clipping bound C.
        loss_reduction: "mean" or "sum", as Opacus.
    """
    check_fast_supported(model)
    gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction=loss_reduction,
                                               max_grad_norm=max_grad_norm, use_ghost_clipping=True)
    attach_fast_norm_samplers(gsm)
    return gsm
