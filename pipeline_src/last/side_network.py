"""LAST side network: low-rank self-attention (LSA) modules fed by frozen backbone features.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024 (Algorithm 1).

Side network over features z_0..z_m (see `features.py`; z_i = output of backbone block i·g):
    u_0 = z_0
    h_i = u_{i-1} + z_i,            u_i = LSA_{i,T}(... LSA_{i,1}(h_i))      i = 1..m
    representation = u_m - sum_{i=0}^{m-1} z_i    (bias correction; u_m without it)
    logits = head(fc_norm(pool(norm(representation))))   -- applied the way the backbone
                                                            applies its own head
With every up-projection B = 0 each LSA is the identity, u_m = sum_{i<=m} z_i and the
corrected representation is exactly z_m, the backbone's last block output.

Symmetry used by the matching step (per LSA module, per head h; R any orthogonal r/n x r/n):
    * Q/K: replacing the head's rows of A_Q and A_K (weights and biases) by R·A_Q[h], R·A_K[h]
      leaves Q_h·K_hᵀ = (A_Q[h] x)(A_K[h] x)ᵀ unchanged, so the attention weights are unchanged.
    * V/B: replacing the head's rows of A_V by R_v·A_V[h] (and its bias) and the head's
      columns of B by B[:, h]·R_vᵀ leaves B[:, h]·(P_h V_h) unchanged.
    Head h owns rows h·r/n:(h+1)·r/n of A_Q, A_K, A_V and the same columns of B. Heads can
    also be permuted jointly across A_Q, A_K, A_V and B.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer, global_pool_nlc
from torch import Tensor

from pipeline_src.last.features import check_every


class LowRankSelfAttention(nn.Module):
    """One LSA module: x + B(MHA_r(A_Q·LN(x), A_K·LN(x), A_V·LN(x))); no FFN by default (the
    paper's LSA), or then y + W_2·GELU(W_1·LN(y)) with a small FFN of `ffn_hidden` units (the FFN
    ablation of LAST, Table 6).

    Attention runs on r dims split into n heads with scale 1/sqrt(r/n). With `fused_attn`
    (default, like timm's Attention) it uses `F.scaled_dot_product_attention`, which does not
    keep the N x N attention map for backward; set `fused_attn = False` for the written-out
    math path (e.g. for vmap or forward-mode AD).
    A_Q, A_K, A_V, B are plain `nn.Linear` modules (Opacus grad samplers apply); see the
    module docstring for the per-head rotation symmetry.

    Args:
        dim: token width D of the backbone.
        rank: r, the width of the attention (divisible by `heads`).
        heads: n, number of attention heads.
        qkv_bias: bias in A_Q, A_K, A_V.
        proj_bias: bias in B.
        zero_init_up: start with B = 0 (module starts as the identity).
        norm_eps: LayerNorm epsilon (timm ViTs use 1e-6).
        ffn_hidden: hidden units of the FFN after the attention (0: none, the paper's LSA).
    """

    def __init__(self, dim: int, rank: int, heads: int, *, qkv_bias: bool = True, proj_bias: bool = True,
                 zero_init_up: bool = False, norm_eps: float = 1e-6, ffn_hidden: int = 0) -> None:
        super().__init__()
        if rank < 1 or heads < 1 or rank % heads != 0:
            raise ValueError(f"LowRankSelfAttention: rank={rank} must be a positive multiple of heads={heads}")
        self.rank, self.heads, self.head_dim = rank, heads, rank // heads
        self.scale = self.head_dim ** -0.5
        self.zero_init_up = zero_init_up
        self.fused_attn = True
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.a_q = nn.Linear(dim, rank, bias=qkv_bias)
        self.a_k = nn.Linear(dim, rank, bias=qkv_bias)
        self.a_v = nn.Linear(dim, rank, bias=qkv_bias)
        self.b = nn.Linear(rank, dim, bias=proj_bias)
        if ffn_hidden < 0:
            raise ValueError(f"LowRankSelfAttention: ffn_hidden={ffn_hidden} must be >= 0")
        self.ffn_hidden = ffn_hidden
        if ffn_hidden:  # pre-norm FFN as a timm Block's MLP: LN -> fc1 -> GELU -> fc2, residual
            self.ffn_norm = nn.LayerNorm(dim, eps=norm_eps)
            self.fc1 = nn.Linear(dim, ffn_hidden)
            self.fc2 = nn.Linear(ffn_hidden, dim)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator, std: float = 0.02) -> None:
        """timm-ViT style init: truncated normal weights (std 0.02), zero biases, unit LN."""
        self.norm.reset_parameters()
        ffn = (self.fc1, self.fc2) if self.ffn_hidden else ()
        if self.ffn_hidden:
            self.ffn_norm.reset_parameters()
        for lin in (self.a_q, self.a_k, self.a_v, self.b, *ffn):
            nn.init.trunc_normal_(lin.weight, std=std, a=-2 * std, b=2 * std, generator=generator)
            if lin.bias is not None:
                lin.bias.zero_()
        if self.zero_init_up:  # the module starts as the identity: B and the FFN's output are 0
            for lin in (self.b, *ffn[1:]):
                lin.weight.zero_()

    def forward(self, x: Tensor) -> Tensor:
        bsz, n_tok, _ = x.shape
        y = self.norm(x)

        def split(t: Tensor) -> Tensor:  # (B, N, r) -> (B, n, N, r/n)
            return t.reshape(bsz, n_tok, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.a_q(y)), split(self.a_k(y)), split(self.a_v(y))
        if self.fused_attn:
            o = F.scaled_dot_product_attention(q, k, v, scale=self.scale)  # (B, n, N, r/n)
        else:
            attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)  # (B, n, N, N)
            o = attn @ v
        o = o.transpose(1, 2).reshape(bsz, n_tok, self.rank)  # (B, N, r)
        x = x + self.b(o)
        if self.ffn_hidden:
            x = x + self.fc2(F.gelu(self.fc1(self.ffn_norm(x))))
        return x


class SideNetwork(nn.Module):
    """LAST side network with its own final norm copy and a trainable classifier head.

    The backbone is only read at construction (width, depth, pooling, and a copy of its
    final `norm` / `fc_norm`); it is not a submodule, so no backbone parameter can train.

    Args:
        backbone: the frozen timm VisionTransformer whose features feed this network.
        rank: r of every LSA module.
        heads: n of every LSA module.
        every: g; one LSA block after every g backbone blocks (g must divide the depth).
        modules_per_block: T, LSA modules per block.
        num_classes: classifier outputs.
        bias_correction: subtract sum_{i<m} z_i from u_m (switch off for the ablation).
        zero_init_up: initialize every B to 0.
        seed: seed of the random init (independent of the global RNG).
        qkv_bias: bias in A_Q, A_K, A_V.
        proj_bias: bias in B.
        ffn_hidden: a small FFN of this many hidden units in every LSA module (0: none; the
            FFN ablation of LAST, Table 6).
    """

    def __init__(self, backbone: VisionTransformer, *, rank: int, heads: int, every: int, modules_per_block: int,
                 num_classes: int, bias_correction: bool = True, zero_init_up: bool = False, seed: int = 0,
                 qkv_bias: bool = True, proj_bias: bool = True, ffn_hidden: int = 0) -> None:
        super().__init__()
        if getattr(backbone, "attn_pool", None) is not None:
            raise NotImplementedError("SideNetwork: backbones with an attention-pooling (MAP) head are not supported")
        if backbone.global_pool not in ("token", "avg", "avgmax", "max"):
            raise ValueError(f"SideNetwork: backbone global_pool={backbone.global_pool!r} is not supported "
                             "(need 'token', 'avg', 'avgmax' or 'max')")
        if modules_per_block < 1:
            raise ValueError(f"SideNetwork: modules_per_block={modules_per_block} must be >= 1")
        if num_classes < 1:
            raise ValueError(f"SideNetwork: num_classes={num_classes} must be >= 1")
        self.num_blocks = check_every(backbone, every)
        self.depth, self.every = len(backbone.blocks), every
        self.bias_correction = bias_correction
        self.ffn_hidden = ffn_hidden
        dim = backbone.embed_dim
        ref = next(backbone.parameters())
        self.blocks = nn.ModuleList(
            nn.Sequential(*(LowRankSelfAttention(dim, rank, heads, qkv_bias=qkv_bias, proj_bias=proj_bias,
                                                 zero_init_up=zero_init_up, ffn_hidden=ffn_hidden)
                            for _ in range(modules_per_block)))
            for _ in range(self.num_blocks))
        # Pooling exactly as the backbone's forward_head; norms start as copies of the backbone's.
        self.global_pool = backbone.global_pool
        self.num_prefix_tokens = backbone.num_prefix_tokens
        self.pool_include_prefix = getattr(backbone, "pool_include_prefix", False)
        self.norm = copy.deepcopy(backbone.norm)
        self.fc_norm = copy.deepcopy(backbone.fc_norm)
        self.head = nn.Linear(dim, num_classes)
        self.requires_grad_(True)  # the norm copies may come from a frozen backbone
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for block in self.blocks:
                for lsa in block:
                    lsa.reset_parameters(g)
            nn.init.trunc_normal_(self.head.weight, std=0.02, a=-0.04, b=0.04, generator=g)
            self.head.bias.zero_()
        self.to(device=ref.device, dtype=ref.dtype)

    def representation(self, features: list[Tensor]) -> Tensor:
        """Bias-corrected side representation, shape (B, N, D), before the final norm.

        Args:
            features: [z_0, ..., z_m] from `extract_features(backbone, x, every=g)`.
        """
        if len(features) != self.num_blocks + 1:
            raise ValueError(f"SideNetwork: expected {self.num_blocks + 1} feature tensors (z_0..z_m for "
                             f"every={self.every}, depth={self.depth}), got {len(features)}")
        u = features[0]
        for z, block in zip(features[1:], self.blocks):
            u = block(u + z)  # h_i = u_{i-1} + z_i
        if self.bias_correction:
            u = u - sum(features[:-1])  # remove z_0..z_{m-1}, which the residual path accumulated
        return u

    def forward(self, features: list[Tensor]) -> Tensor:
        """Logits (B, num_classes) from [z_0, ..., z_m]."""
        x = self.norm(self.representation(features))
        x = global_pool_nlc(x, pool_type=self.global_pool, num_prefix_tokens=self.num_prefix_tokens,
                            reduce_include_prefix=self.pool_include_prefix)  # (B, D)
        return self.head(self.fc_norm(x))
