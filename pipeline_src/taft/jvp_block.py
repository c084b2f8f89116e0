"""Closed-form JVP of timm's ViT ``Attention``, ``Mlp`` and pre-norm ``Block``.

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and
Removal", ICLR 2024 (TAFT), Sec. 3 (linearized attention and MLP).

Attention per head, with timm's fused ``qkv`` layout (rows ordered qkv, head, d_h)
and scale s = 1/√d_h:
    S  = s·Q·Kᵀ,            P  = softmax(S),          A  = P·V
    dS = s·(dQ·Kᵀ + Q·dKᵀ),  dP = P ⊙ (dS − rowsum(P ⊙ dS)),  dA = dP·V + P·dV
The row sum is an O(N²) reduction (never diag(dS·Pᵀ), which is O(N³)).

qk_norm (timm ``qk_norm=True``; Dehghani et al. 2023, "Scaling Vision Transformers to 22
Billion Parameters", §3.1): a LayerNorm over d_h on each head's q and k before the scale,
so (Q, dQ) ← LN-JVP(Q, dQ) per head, with the LayerNorm JVP of `TangentLayerNorm`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from pipeline_src.taft.jvp_layers import (
    Tangent,
    TangentLayerNorm,
    TangentLayerScale,
    TangentLinear,
    accumulate_in_place,
    add_tangents,
    tangent_activation,
    tangent_grad,
)


def _require_identity(module: nn.Module, what: str) -> None:
    if not isinstance(module, nn.Identity):
        raise ValueError(f"TAFT: unsupported {what} ({type(module).__name__}); only nn.Identity is supported")


def dropout_rate(module: nn.Module) -> float:
    """Drop probability of a Dropout / DropPath / PatchDropout (0 for Identity)."""
    for attr in ("p", "drop_prob", "prob"):
        if hasattr(module, attr) and isinstance(getattr(module, attr), (int, float)):
            return float(getattr(module, attr))
    return 0.0


def _baddbmm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc + a·b, in place where allowed (`accumulate_in_place`; saves a (B·H, N, N) buffer);
    out of place otherwise: torch.func.vmap has no batching rule for ``baddbmm_`` and loops."""
    if accumulate_in_place():  # in-place ops bypass autocast: match the accumulator's dtype
        return acc.baddbmm_(a.to(acc.dtype), b.to(acc.dtype))
    return torch.baddbmm(acc, a, b)


class TangentAttention(nn.Module):
    """JVP of timm ``Attention`` (fused qkv, optional qkv bias and LayerNorm qk_norm; no
    scale_norm or gate).

    Args:
        base: timm ``Attention``.
        delta_init_std: std of the Δ init.
        generator: CPU generator for a non-zero Δ init.
    """

    def __init__(self, base: nn.Module, delta_init_std: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        from timm.layers import Attention

        if type(base) is not Attention:
            raise TypeError(f"TAFT: unsupported attention module {type(base).__name__} (only timm Attention)")
        _require_identity(base.norm, "attn.norm (scale_attn_norm=True)")
        if getattr(base, "gate", None) is not None:
            raise ValueError("TAFT: unsupported attn.gate (gated attention)")
        self.num_heads = base.num_heads
        self.head_dim = base.head_dim
        self.attn_dim = base.attn_dim
        self.scale = base.scale
        self.qkv = TangentLinear(base.qkv, delta_init_std, generator)
        self.q_norm = _qk_norm(base.q_norm, "attn.q_norm", delta_init_std, generator)
        self.k_norm = _qk_norm(base.k_norm, "attn.k_norm", delta_init_std, generator)
        self.proj = TangentLinear(base.proj, delta_init_std, generator)

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, torch.Tensor]:
        B, N, _ = x.shape
        H, dh = self.num_heads, self.head_dim
        qkv, dqkv = self.qkv(x, t)  # (B, N, 3·H·dh) each
        if self.q_norm is None and self.k_norm is None:
            # (B, N, 3, H, dh) -> (3, B·H, N, dh): contiguous per-head matrices for bmm.
            q, k, v = qkv.reshape(B, N, 3, H, dh).permute(2, 0, 3, 1, 4).reshape(3, B * H, N, dh).unbind(0)
            dq, dk, dv = dqkv.reshape(B, N, 3, H, dh).permute(2, 0, 3, 1, 4).reshape(3, B * H, N, dh).unbind(0)
        else:
            # The norms' Δ modules see (B, H, N, dh) with the batch first, as Opacus' per-sample
            # rules need; only then are heads folded into the bmm batch.
            q, k, v = qkv.reshape(B, N, 3, H, dh).permute(2, 0, 3, 1, 4).unbind(0)
            dq, dk, dv = dqkv.reshape(B, N, 3, H, dh).permute(2, 0, 3, 1, 4).unbind(0)
            if self.q_norm is not None:
                q, dq = self.q_norm(q, dq)
            if self.k_norm is not None:
                k, dk = self.k_norm(k, dk)
            q, k, v, dq, dk, dv = (z.reshape(B * H, N, dh) for z in (q, k, v, dq, dk, dv))
        q = q * self.scale
        kt = k.transpose(1, 2)
        p = torch.bmm(q, kt).softmax(dim=-1)  # (B·H, N, N)
        a = torch.bmm(p, v)  # (B·H, N, dh)
        a = a.view(B, H, N, dh).transpose(1, 2).reshape(B, N, self.attn_dim)  # (B, N, H·dh)
        with tangent_grad():
            dq = dq * self.scale
            # The (B·H, N, N) tensors dominate memory: accumulate in place, and rebind names so
            # each intermediate is freed as soon as the next one exists.
            dp = _baddbmm(torch.bmm(dq, kt), q, dk.transpose(1, 2))  # dS = dQ·Kᵀ + Q·dKᵀ
            # dP = P ⊙ (dS − rowsum(P ⊙ dS)): the softmax Jacobian is symmetric, so this is
            # softmax's backward kernel applied to dS (fused, O(N²), and differentiable in dS).
            dp = torch._softmax_backward_data(dp.to(p.dtype), p, -1, p.dtype)  # p: float32 under CUDA autocast
            da = _baddbmm(torch.bmm(p, dv), dp, v)  # P·dV + dP·V
            da = da.view(B, H, N, dh).transpose(1, 2).reshape(B, N, self.attn_dim)
        return self.proj(a, da)


class TangentMlp(nn.Module):
    """JVP of timm ``Mlp``: fc1 → GELU or QuickGELU → fc2 (no hidden norm).

    Args:
        base: timm ``Mlp``.
        delta_init_std: std of the Δ init.
        generator: CPU generator for a non-zero Δ init.
    """

    def __init__(self, base: nn.Module, delta_init_std: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        from timm.layers import Mlp

        if type(base) is not Mlp:
            raise TypeError(f"TAFT: unsupported mlp module {type(base).__name__} (only timm Mlp; no SwiGLU/GluMlp)")
        _require_identity(base.norm, "mlp.norm (scale_mlp_norm=True)")
        if type(base.fc1) is not nn.Linear:
            raise TypeError("TAFT: unsupported Mlp with use_conv=True")
        self.fc1 = TangentLinear(base.fc1, delta_init_std, generator)
        self.act = tangent_activation(base.act)
        self.fc2 = TangentLinear(base.fc2, delta_init_std, generator)

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, torch.Tensor]:
        h, dh = self.fc1(x, t)
        h, dh = self.act(h, dh)
        return self.fc2(h, dh)


class _IdentityJVP(nn.Module):
    """Pass-through for a switched-off LayerScale."""

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, Tangent]:
        return x, t


class TangentBlock(nn.Module):
    """JVP of timm's pre-norm ``Block``:
    x ← x + ls1(attn(norm1(x))),  x ← x + ls2(mlp(norm2(x))), with residual tangents added.

    Args:
        base: timm ``Block``.
        delta_init_std: std of the Δ init.
        generator: CPU generator for a non-zero Δ init.
    """

    def __init__(self, base: nn.Module, delta_init_std: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        from timm.models.vision_transformer import Block

        if type(base) is not Block:
            raise TypeError(f"TAFT: unsupported block type {type(base).__name__} (only timm vision_transformer.Block)")
        self.norm1 = TangentLayerNorm(base.norm1, delta_init_std, generator)
        self.attn = TangentAttention(base.attn, delta_init_std, generator)
        self.ls1 = _layer_scale(base.ls1, delta_init_std, generator)
        self.norm2 = TangentLayerNorm(base.norm2, delta_init_std, generator)
        self.mlp = TangentMlp(base.mlp, delta_init_std, generator)
        self.ls2 = _layer_scale(base.ls2, delta_init_std, generator)

    def forward(self, x: torch.Tensor, t: Tangent) -> tuple[torch.Tensor, torch.Tensor]:
        a, da = self.ls1(*self.attn(*self.norm1(x, t)))
        x, t = x + a, add_tangents(t, da)  # tangent-only ops need no `tangent_grad`
        m, dm = self.ls2(*self.mlp(*self.norm2(x, t)))
        return x + m, t + dm


def _qk_norm(base: nn.Module, what: str, delta_init_std: float,
             generator: Optional[torch.Generator]) -> Optional[TangentLayerNorm]:
    if isinstance(base, nn.Identity):
        return None
    try:
        return TangentLayerNorm(base, delta_init_std, generator)
    except (TypeError, ValueError) as e:
        raise ValueError(f"TAFT: unsupported {what} (qk_norm=True with {type(base).__name__}): {e}") from e


def _layer_scale(base: nn.Module, delta_init_std: float, generator: Optional[torch.Generator]) -> nn.Module:
    if isinstance(base, nn.Identity):
        return _IdentityJVP()
    return TangentLayerScale(base, delta_init_std, generator)
