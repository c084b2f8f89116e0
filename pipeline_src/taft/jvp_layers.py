"""Closed-form JVP primitives for tangent (linearized) networks.

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and
Removal", ICLR 2024 (TAFT). The tangent model is f_w(x) + J_w f(x)·Δw; we
propagate (primal, tangent) pairs instead of calling forward-mode AD.

Every layer here takes ``(x, t)`` and returns ``(y, dy)``:
    y  = f_w(x)                         (primal, frozen weights w)
    dy = ∂f/∂x · t + ∂f/∂w · Δw          (tangent)
``t is None`` stands for an all-zero tangent (the output of the frozen prefix),
which saves the ``W·t`` products in the first linearized layer.

DP contract (Opacus): every Δ lives in a *standard* module applied to the
*primal* input and called exactly once per forward:
    ΔW·x + Δb     -> ``nn.Linear`` (``TangentLinear.delta``)
    Δγ·x̂ + Δβ     -> ``nn.LayerNorm`` with the base eps (``TangentLayerNorm.delta``)
    Δγ ⊙ x        -> ``DeltaScale`` (LayerScale; needs its own grad sampler,
                     see ``delta_scale_grad_sample``)
Frozen base weights are buffers, so they never appear in ``parameters()``.

Every layer computes its primal ops first and its tangent ops inside ``tangent_grad()``:
a no-op normally, ``torch.no_grad()`` under `primal_gradient.primal_gradient` (plain training),
where the gradient w.r.t. Δw is taken through the primal ops instead (see that module).
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

Tangent = Optional[torch.Tensor]

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class _Mode(threading.local):
    primal_grad = False
    vmapped = False


_MODE = _Mode()


def primal_grad_enabled() -> bool:
    """True inside `primal_grad_mode`: tangents are computed without autograd."""
    return _MODE.primal_grad


@contextlib.contextmanager
def primal_grad_mode(vmapped: bool = False) -> Iterator[None]:
    """Switch every layer's tangent ops to no-grad (this thread); see `primal_gradient`.

    Args:
        vmapped: the forward runs under `torch.func.vmap`, which has no batching rule for the
            in-place accumulations (``addmm_``, ``baddbmm_``) and would loop: use out-of-place ops.
    """
    prev = _MODE.primal_grad, _MODE.vmapped
    _MODE.primal_grad, _MODE.vmapped = True, vmapped
    try:
        yield
    finally:
        _MODE.primal_grad, _MODE.vmapped = prev


def accumulate_in_place() -> bool:
    """Whether a tangent op may accumulate into its own fresh output: no graph is recorded and
    no vmap is active."""
    return not torch.is_grad_enabled() and not _MODE.vmapped


def tangent_grad() -> contextlib.AbstractContextManager:
    """Context of a layer's tangent ops: no autograd in `primal_grad_mode`, unchanged otherwise."""
    return torch.no_grad() if _MODE.primal_grad else contextlib.nullcontext()


def add_tangents(a: Tangent, b: Tangent) -> Tangent:
    """Sum of two tangents where None means zero."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _init_delta_(tensors: list[torch.Tensor], std: float, generator: Optional[torch.Generator]) -> None:
    """Zero (std=0) or N(0, std²) init of Δ tensors, drawn on CPU so every device agrees."""
    with torch.no_grad():
        for p in tensors:
            if std == 0.0:
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype) * std)


class TangentLinear(nn.Module):
    """JVP of ``nn.Linear``: dy = W·t + (ΔW·x + Δb).

    Args:
        base: the linear layer to linearize; its weight/bias are copied into buffers.
        delta_init_std: std of the Δ init (0 gives Δ = 0).
        generator: CPU generator for a non-zero Δ init.
    """

    def __init__(self, base: nn.Linear, delta_init_std: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        if type(base) is not nn.Linear:
            raise TypeError(f"TangentLinear supports nn.Linear only, got {type(base).__name__}")
        self.register_buffer("weight", base.weight.detach().clone())
        self.register_buffer("bias", None if base.bias is None else base.bias.detach().clone())
        self.delta = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                               device=base.weight.device, dtype=base.weight.dtype)
        _init_delta_(list(self.delta.parameters()), delta_init_std, generator)

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.linear(x, self.weight, self.bias)
        with tangent_grad():
            dy = self.delta(x)  # ΔW·x + Δb: the one call of the Δ module
            if t is not None:
                # dy + t·Wᵀ as one GEMM with accumulate, on (rows, features) views; in place where
                # allowed (out of place, addmm first copies dy).
                rows, t2 = dy.reshape(-1, dy.shape[-1]), t.reshape(-1, t.shape[-1])
                if accumulate_in_place():  # in-place ops bypass autocast: match the accumulator's dtype
                    dy = rows.addmm_(t2.to(rows.dtype), self.weight.t().to(rows.dtype)).view(dy.shape)
                else:
                    dy = torch.addmm(rows, t2, self.weight.t()).view(dy.shape)
        return y, dy

    def pairs(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Local parameter name -> (base value, Δ parameter)."""
        out = {"weight": (self.weight, self.delta.weight)}
        if self.bias is not None:
            out["bias"] = (self.bias, self.delta.bias)
        return out


class TangentLayerNorm(nn.Module):
    """JVP of LayerNorm y = γ·x̂ + β with x̂ = (x − μ)·rstd:

        dx̂ = rstd·(t − mean(t) − x̂·mean(t ⊙ x̂)),   dy = γ·dx̂ + (Δγ·x̂ + Δβ).

    Args:
        base: ``nn.LayerNorm`` (or timm's subclass) with an elementwise affine.
        delta_init_std: std of the Δ init (0 gives Δ = 0).
        generator: CPU generator for a non-zero Δ init.
    """

    def __init__(self, base: nn.LayerNorm, delta_init_std: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        from timm.layers import LayerNorm as TimmLayerNorm

        if type(base) not in (nn.LayerNorm, TimmLayerNorm):
            raise TypeError(f"TangentLayerNorm supports nn.LayerNorm / timm LayerNorm only, got {type(base).__name__}")
        if base.weight is None or base.bias is None:
            raise ValueError("TangentLayerNorm needs a LayerNorm with elementwise affine weight and bias")
        if len(base.normalized_shape) != 1:
            raise ValueError(f"TangentLayerNorm supports a 1-D normalized_shape, got {base.normalized_shape}")
        self.normalized_shape = tuple(base.normalized_shape)
        self.eps = float(base.eps)
        self.register_buffer("weight", base.weight.detach().clone())
        self.register_buffer("bias", base.bias.detach().clone())
        # Δγ·x̂ + Δβ is exactly a LayerNorm with affine (Δγ, Δβ) and the same eps.
        self.delta = nn.LayerNorm(self.normalized_shape, eps=self.eps,
                                  device=base.weight.device, dtype=base.weight.dtype)
        _init_delta_([self.delta.weight, self.delta.bias], delta_init_std, generator)

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, torch.Tensor]:
        if t is None:
            y = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            with tangent_grad():
                return y, self.delta(x)
        # in the weight's dtype, as autocast runs layer_norm (float32): these aten ops bypass autocast
        x, t = x.to(self.weight.dtype), t.to(self.weight.dtype)
        y, mean, rstd = torch.native_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        with tangent_grad():
            dy = self.delta(x)
            # ∂x̂/∂x = rstd·(I − 11ᵀ/D − x̂x̂ᵀ/D) is symmetric, so its JVP is LayerNorm's affine-free
            # backward applied to t: one fused kernel, itself differentiable in t.
            dxhat = torch.ops.aten.native_layer_norm_backward(
                t, x, self.normalized_shape, mean, rstd, None, None, [True, False, False])[0]
            return y, torch.addcmul(dy, dxhat, self.weight)

    def pairs(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Local parameter name -> (base value, Δ parameter)."""
        return {"weight": (self.weight, self.delta.weight), "bias": (self.bias, self.delta.bias)}


def gelu_derivative(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Exact derivative of GELU, written out (the reference formula).

    erf form: d/dx[x·Φ(x)] = Φ(x) + x·φ(x) (the seed's eq. 13 writes x·Φ(x), which is wrong).
    tanh form: g = ½x(1 + tanh u), u = √(2/π)(x + 0.044715x³),
               g' = ½(1 + tanh u) + ½x(1 − tanh²u)·√(2/π)(1 + 3·0.044715x²).

    Args:
        x: pre-activation.
        approximate: 'none' (erf) or 'tanh', as in ``F.gelu``.
    """
    if approximate == "none":
        return torch.special.ndtr(x) + x * torch.exp(-0.5 * x * x) * _INV_SQRT_2PI
    if approximate == "tanh":
        th = torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
        return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
    raise ValueError(f"gelu: unsupported approximate={approximate!r} (use 'none' or 'tanh')")


def gelu_jvp(x: torch.Tensor, t: torch.Tensor, approximate: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    """GELU and its JVP g'(x)·t.

    ``aten.gelu_backward(t, x)`` evaluates exactly `gelu_derivative(x)·t` in one fused
    kernel (about 5× faster on CPU than the written-out formula) and is itself
    differentiable in t, so training can backpropagate through it.

    Args:
        x: primal pre-activation.
        t: its tangent.
        approximate: 'none' (erf) or 'tanh', as in ``F.gelu``.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_jvp: unsupported approximate={approximate!r} (use 'none' or 'tanh')")
    y = F.gelu(x, approximate=approximate)
    with tangent_grad():
        return y, torch.ops.aten.gelu_backward(t.to(x.dtype), x, approximate=approximate)


class TangentGELU(nn.Module):
    """JVP of GELU (no parameters). Accepts ``nn.GELU`` and timm's ``GELU`` / ``GELUTanh``.

    Args:
        base: the activation module, used to read which GELU variant it is.
    """

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        from timm.layers.activations import GELU as TimmGELU
        from timm.layers.activations import GELUTanh

        if type(base) is nn.GELU:
            self.approximate = base.approximate
        elif type(base) is TimmGELU:
            self.approximate = "none"
        elif type(base) is GELUTanh:
            self.approximate = "tanh"
        else:
            raise TypeError(f"TangentGELU: unsupported activation {type(base).__name__} "
                            "(only nn.GELU, timm GELU and GELUTanh)")

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, Tangent]:
        if t is None:
            return F.gelu(x, approximate=self.approximate), None
        return gelu_jvp(x, t, self.approximate)


_QUICK_GELU_A = 1.702


def quick_gelu_jvp(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """QuickGELU q(x) = x·σ(a·x), a = 1.702, and its JVP q'(x)·t with
    q'(x) = σ(ax) + a·x·σ(ax)(1 − σ(ax)) (closed form; differentiable in t).

    Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
    Supervision" (CLIP; the activation of OpenAI's image towers, timm ``quick_gelu``).

    Args:
        x: primal pre-activation.
        t: its tangent.
    """
    s = torch.sigmoid(_QUICK_GELU_A * x)
    y = x * s
    with tangent_grad():
        return y, s * (1.0 + _QUICK_GELU_A * x * (1.0 - s)) * t


class TangentQuickGELU(nn.Module):
    """JVP of timm ``QuickGELU`` (no parameters), see `quick_gelu_jvp`.

    Args:
        base: timm ``QuickGELU``.
    """

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        from timm.layers.activations import QuickGELU

        if type(base) is not QuickGELU:
            raise TypeError(f"TangentQuickGELU supports timm QuickGELU only, got {type(base).__name__}")

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, Tangent]:
        if t is None:
            return x * torch.sigmoid(_QUICK_GELU_A * x), None
        return quick_gelu_jvp(x, t)


def tangent_activation(base: nn.Module) -> nn.Module:
    """The JVP module of an MLP activation: GELU (erf/tanh) or QuickGELU; anything else raises.

    Args:
        base: the activation module of a timm ``Mlp``.
    """
    from timm.layers.activations import QuickGELU

    if type(base) is QuickGELU:
        return TangentQuickGELU(base)
    try:
        return TangentGELU(base)
    except TypeError:
        raise TypeError(f"TAFT: unsupported mlp activation {type(base).__name__} "
                        "(supported: nn.GELU, timm GELU, GELUTanh, QuickGELU)") from None


class DeltaScale(nn.Module):
    """Elementwise Δγ ⊙ x over the last dim (the Δ of a LayerScale).

    Opacus has no grad sampler for this; register ``delta_scale_grad_sample``.

    Args:
        dim: channel count.
    """

    def __init__(self, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def delta_scale_grad_sample(layer: DeltaScale, activations: list[torch.Tensor],
                            backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-sample gradient of ``DeltaScale`` in Opacus' grad-sampler signature:
    g_b = Σ_tokens x_b ⊙ ∂L/∂y_b, shape (B, D)."""
    x = activations[0]
    return {layer.weight: (x * backprops).reshape(x.shape[0], -1, x.shape[-1]).sum(1)}


class TangentLayerScale(nn.Module):
    """JVP of timm ``LayerScale`` y = γ ⊙ x: dy = γ ⊙ t + Δγ ⊙ x.

    Args:
        base: timm ``LayerScale``.
        delta_init_std: std of the Δ init (0 gives Δ = 0).
        generator: CPU generator for a non-zero Δ init.
    """

    def __init__(self, base: nn.Module, delta_init_std: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        from timm.layers import LayerScale

        if type(base) is not LayerScale:
            raise TypeError(f"TangentLayerScale supports timm LayerScale only, got {type(base).__name__}")
        self.register_buffer("gamma", base.gamma.detach().clone())
        self.delta = DeltaScale(self.gamma.shape[0], device=self.gamma.device, dtype=self.gamma.dtype)
        _init_delta_([self.delta.weight], delta_init_std, generator)

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * self.gamma
        with tangent_grad():
            dy = self.delta(x)
            if t is not None:
                dy = dy + t * self.gamma
        return y, dy

    def pairs(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Local parameter name -> (base value, Δ parameter)."""
        return {"gamma": (self.gamma, self.delta.weight)}
