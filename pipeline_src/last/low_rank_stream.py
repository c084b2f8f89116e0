"""Forward of M same-architecture LAST side networks on one shared batch, in low-rank form.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024 (Algorithm 1). `side_network.py` is the one-network
module form; this file computes the same function for a stack of M networks (parameters with a
leading member dim M, as `torch.func.stack_module_state` makes them) without ever forming a
network's D-wide residual stream. `grid.py` trains with it.

Why that is possible. The stream entering an LSA module of side block i is, per network,
    x = S_i + W c                                   (B, N, D)
    S_i = z_0 + z_1 + ... + z_i                     (B, N, D)   shared by all networks, no grad
    W   = [e, B_1, ..., B_k]                        (D, K)      up-projections of the k modules
                                                                before this one; e = sum of their biases
    c   = [1, o_1, ..., o_k]                        (B, N, K)   their attention outputs (r wide each)
because every side block adds z_i and every module adds B·o + b; K = 1 + k·r grows by r per
module (ViT-B, r = 16, 12 modules: K <= 177, against D = 768).

LayerNorm and down-projection of x for one module (A = [A_Q; A_K; A_V], a its bias, γ, β the LN affine):
    x̃ = x − mean_D(x) = S̃ + W̃ c          S̃ = S − mean_D(S) (shared),  W̃ = W − mean_D(W) (per column)
    D·var(x) = |S̃|² + 2 (S̃ᵀW̃)·c + cᵀ(W̃ᵀW̃)c
    A·LN(x) + a = [(A diag γ) S̃ + (A diag γ W̃) c] / sqrt(var + eps) + (A β + a)
The two products with the D-wide shared S̃, (A diag γ)·S̃ and S̃ᵀW̃, are ONE matmul for the whole
grid (S̃ against every network's [A diag γ; W̃ᵀ] stacked); all else is K or r wide per network,
so no network keeps a D-wide tensor for backward. Attention runs over the M·B (network,
sample) pairs by the path measured fastest on the device (`small_head_attention.py`).
The representation u_m − Σ_{i<m} z_i = z_m + W c (S_m + W c without bias
correction) is formed D-wide only for the tokens the head reads when pooling commutes with the
final norm ('token' pooling; 'avg' with no pre-pool norm), otherwise in full, once.

Cost per network and module: B·N·D·(3r + K) multiply-adds inside the shared matmul plus
B·N·K·(3r + K) in K-wide ones, against B·N·D·4r for the dense module, whose D-wide element-wise
work (residual adds, LayerNorm) dominates on GPUs; the K-wide terms make the low-rank form lose
when T·m·r approaches D.
Numerics: var comes from the expansion above, not from mean((x − μ)²); the two are equal in
exact arithmetic and differ by rounding unless the side stream W c cancels most of S̃.
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn as nn
from timm.models.vision_transformer import global_pool_nlc
from torch import Tensor
from torch.func import functional_call, vmap

from pipeline_src.last.side_network import LowRankSelfAttention, SideNetwork
from pipeline_src.last.small_head_attention import attention


def _sub(params: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of `params` under `prefix`, with the prefix removed."""
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def _lsa_attention(lsa: LowRankSelfAttention, p: Mapping[str, Tensor], s_c: Tensor, s_sq: Tensor, w: Tensor,
                   c: Tensor) -> Tensor:
    """Attention output o, shape (M, B, N, r), of one LSA module of every network on x = S + W c.

    Args:
        lsa: the module (read for rank, heads, scale and LayerNorm eps only; may be on "meta").
        p: its stacked parameters, named as in `LowRankSelfAttention` ("norm.weight", "a_q.weight", ...).
        s_c: S̃, the shared stream centered over D, (B, N, D).
        s_sq: |S̃|² per token, (B, N).
        w: W, (M, D, K).
        c: coefficients, (M, B, N, K).
    """
    n_net, dim, k = w.shape
    bsz, n_tok, _ = s_c.shape
    r3 = 3 * lsa.rank
    a = torch.cat([p["a_q.weight"], p["a_k.weight"], p["a_v.weight"]], 1)  # (M, 3r, D)
    f = a * p["norm.weight"].unsqueeze(1)  # A diag(γ), (M, 3r, D)
    const = (a @ p["norm.bias"].unsqueeze(-1)).squeeze(-1)  # A β, (M, 3r)
    if "a_q.bias" in p:
        const = const + torch.cat([p["a_q.bias"], p["a_k.bias"], p["a_v.bias"]], 1)
    w_c = w - w.mean(1, keepdim=True)  # W̃, (M, D, K)
    # The one D-wide product: shared S̃ (B·N, D) against every network's [A diag γ; W̃ᵀ].
    right = torch.cat([f, w_c.transpose(1, 2)], 1).reshape(-1, dim)  # (M·(3r+K), D)
    out = (s_c.reshape(-1, dim) @ right.T).view(bsz * n_tok, n_net, r3 + k).transpose(0, 1)  # (M, B·N, 3r+K)
    proj_s, cross = out.split([r3, k], -1)  # (A diag γ) S̃ and S̃ᵀW̃
    c = c.reshape(n_net, bsz * n_tok, k)
    # baddbmm: fused add, and a contiguous (M, B·N, ·) result (`out` is laid out (B·N, M, ·)).
    quad = torch.baddbmm(cross, c, w_c.transpose(1, 2) @ w_c, beta=2) * c  # (2 S̃ᵀW̃ + cᵀW̃ᵀW̃) ⊙ c, (M, BN, K)
    var = (s_sq.reshape(1, -1) + quad.sum(-1)).clamp(min=0) / dim  # (M, B·N), var of x over D
    rstd = (var + lsa.norm.eps).rsqrt().unsqueeze(-1)
    qkv = torch.baddbmm(proj_s, c, (f @ w_c).transpose(1, 2)) * rstd + const.unsqueeze(1)  # A·LN(x) + a, (M, B·N, 3r)

    def heads(t: Tensor) -> Tensor:  # (M, B·N, r) -> (M·B, n, N, r/n)
        return t.reshape(n_net * bsz, n_tok, lsa.heads, lsa.head_dim).transpose(1, 2)

    q, k_, v = (heads(t) for t in qkv.split(lsa.rank, -1))
    o = attention(q, k_, v, lsa.scale)  # (M·B, n, N, r/n); SDPA or bmm by device (small_head_attention.py)
    return o.transpose(1, 2).reshape(n_net, bsz, n_tok, lsa.rank)


def low_rank_representation(net: SideNetwork, params: Mapping[str, Tensor],
                            features: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Bias-corrected representations of M networks as (base, W, c): representation_j = base + W[j] c[j].

    Args:
        net: skeleton of the architecture (its own parameters are not read; may be on "meta").
        params: `net`'s parameter names -> stacked tensors (M, *shape).
        features: [z_0, ..., z_m], each (B, N, D), shared by all networks.

    Returns:
        base (B, N, D): z_m, or S_m = z_0 + ... + z_m without bias correction;
        W (M, D, K); c (M, B, N, K).
    """
    if getattr(net, "ffn_hidden", 0):  # an FFN adds a non-linear D-wide term: no low-rank stream
        raise ValueError(f"LAST grid: side networks with an FFN (ffn_hidden={net.ffn_hidden}) have no low-rank "
                         f"stream form; train them one at a time (the `train` step)")
    if len(features) != net.num_blocks + 1:
        raise ValueError(f"LAST grid: expected {net.num_blocks + 1} feature tensors (z_0..z_m for every={net.every}, "
                         f"depth={net.depth}), got {len(features)}")
    z0 = features[0]
    n_net = next(iter(params.values())).shape[0]
    bsz, n_tok, dim = z0.shape
    w_cols = [z0.new_zeros(n_net, dim, 1)]  # [e, B_1, ...]: e, the sum of the up-projection biases, first
    coefs = [z0.new_ones(n_net, bsz, n_tok, 1)]  # [1, o_1, ...]
    s = z0
    for i, (z, block) in enumerate(zip(features[1:], net.blocks)):
        s = s + z  # S_i
        s_c = s - s.mean(-1, keepdim=True)
        s_sq = s_c.square().sum(-1)
        for t, lsa in enumerate(block):
            p = _sub(params, f"blocks.{i}.{t}.")
            o = _lsa_attention(lsa, p, s_c, s_sq, torch.cat(w_cols, -1), torch.cat(coefs, -1))
            w_cols.append(p["b.weight"])
            coefs.append(o)
            if "b.bias" in p:
                w_cols[0] = w_cols[0] + p["b.bias"].unsqueeze(-1)
    return (features[-1] if net.bias_correction else s), torch.cat(w_cols, -1), torch.cat(coefs, -1)


def _apply_stacked(module: nn.Module, name: str, state: Mapping[str, Tensor], x: Tensor) -> Tensor:
    """`module` of network j on x[j], with network j's parameters `state[name.*][j]`; x is (M, ...)."""
    p = _sub(state, name + ".")
    if not p:
        return module(x)  # parameter-free (Identity)
    return vmap(lambda pj, xj: functional_call(module, pj, (xj,)))(p, x)


def stacked_logits(net: SideNetwork, state: Mapping[str, Tensor], features: list[Tensor]) -> Tensor:
    """Logits (M, B, num_classes) of M side networks of `net`'s architecture on shared features.

    Equal (to rounding) to `functional_call(net, member_state, (features,))` for each member.

    Args:
        net: skeleton of the architecture (its own parameters are not read; may be on "meta").
        state: `net`'s parameter and buffer names -> stacked tensors (M, *shape).
        features: [z_0, ..., z_m], each (B, N, D).
    """
    base, w, c = low_rank_representation(net, state, features)
    n_net, bsz = c.shape[:2]
    pool = dict(pool_type=net.global_pool, num_prefix_tokens=net.num_prefix_tokens,
                reduce_include_prefix=net.pool_include_prefix)
    if net.global_pool == "token" or (net.global_pool == "avg" and isinstance(net.norm, nn.Identity)):
        # Pooling is linear and commutes with the per-token norm: pool first, go D-wide for (M, B) only.
        c_pooled = global_pool_nlc(c.flatten(0, 1), **pool).view(n_net, bsz, -1)  # (M, B, K)
        x = global_pool_nlc(base, **pool) + torch.einsum("mdk,mbk->mbd", w, c_pooled)
        x = _apply_stacked(net.norm, "norm", state, x)
    else:
        x = base + torch.einsum("mdk,mbnk->mbnd", w, c)  # (M, B, N, D)
        x = _apply_stacked(net.norm, "norm", state, x)
        x = global_pool_nlc(x.flatten(0, 1), **pool).view(n_net, bsz, -1)
    return _apply_stacked(net.head, "head", state, _apply_stacked(net.fc_norm, "fc_norm", state, x))
