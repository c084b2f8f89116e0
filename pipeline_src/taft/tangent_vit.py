"""TangentViT: a timm VisionTransformer linearized in its last k blocks (TAFT-k).

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and
Removal", ICLR 2024. The model is

    f_lin(x; Δw) = f_w(x) + J_w f(x) · Δw        (or J·Δw alone with jvp_only)

where w are the frozen base weights of the last k blocks, the final norm /
fc_norm and the head; the first depth−k blocks, patch embed, class/register
tokens and position embedding form a frozen prefix whose output can be cached.

Supported: timm ``Block`` with ``Attention`` (fused qkv, bias on/off, LayerNorm
qk_norm) and ``Mlp`` (GELU erf or tanh, QuickGELU), LayerScale, LayerNorm final norm
or fc_norm, 'token' or 'avg' pooling (register tokens, ``norm_pre`` and the
embeddings ride along in the frozen prefix), and DeiT's distilled model
(``VisionTransformerDistilled``; Touvron et al. 2021, "Training data-efficient image
transformers & distillation through attention"): the class and distillation tokens
feed ``head`` and ``head_dist``, both linearized, and the output is their mean, as
timm's eval forward. Anything else raises (SigLIP 'map' pooling, SwiGLU MLPs, ...).

``reset=True`` ("PT=F") re-initializes the linearized modules with timm's init
under ``reset_seed`` on CPU, so every shard built with the same seed shares the
same linearization point. ``reset_cls=True`` replaces the class-token row of the
linearized input by a fresh token c ~ N(0, 0.02²) (timm's 1e-6 CLS init would put
LayerNorm at a point where its Jacobian scales like 1/√eps) and linearizes it:
that row becomes c + Δc, with Δc held in an ``nn.Embedding(1, D)``.
"""
from __future__ import annotations

import copy
import hashlib
import json
from functools import partial
from typing import Optional

import torch
import torch.nn as nn

from pipeline_src.taft.jvp_block import TangentBlock, dropout_rate
from pipeline_src.taft.jvp_layers import (
    Tangent,
    TangentLayerNorm,
    TangentLinear,
    _init_delta_,
    primal_grad_enabled,
    tangent_grad,
)
from pipeline_src.vit.digest import module_config, state_digest

_SUPPORTED_POOLS = ("token", "avg")
_CLS_RESET_STD = 0.02


def check_supported(base: nn.Module, k: int, reset_cls: bool = False) -> None:
    """Raise a ValueError/TypeError naming the first unsupported option of `base` for TAFT-k."""
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(base, VisionTransformer):
        raise TypeError(f"TAFT: base must be a timm VisionTransformer, got {type(base).__name__}")
    depth = len(base.blocks)
    if not 1 <= k <= depth:
        raise ValueError(f"TAFT: k must be in 1..depth={depth}, got k={k}")
    if base.attn_pool is not None:
        raise ValueError(f"TAFT: unsupported attn_pool {type(base.attn_pool).__name__} "
                         f"(global_pool={base.global_pool!r}, SigLIP-style attention pooling)")
    if base.global_pool not in _SUPPORTED_POOLS:
        raise ValueError(f"TAFT: unsupported global_pool={base.global_pool!r}; supported: {_SUPPORTED_POOLS}")
    if not isinstance(base.head, nn.Linear):
        raise ValueError("TAFT: base.head must be nn.Linear (num_classes > 0)")
    if is_distilled(base):
        if not isinstance(base.head_dist, nn.Linear):
            raise ValueError("TAFT: base.head_dist (the distillation token's head) must be nn.Linear")
        if not isinstance(base.fc_norm, nn.Identity):
            raise ValueError("TAFT: a distilled ViT (dist_token) with fc_norm is unsupported: "
                             "timm's distilled head skips fc_norm")
        if getattr(base, "distilled_training", False):
            raise ValueError("TAFT: a distilled ViT in distillation-training mode (distilled_training=True) returns "
                             "the pair (head, head_dist) in training; TAFT returns their mean. Call "
                             "set_distilled_training(False) first")
    if reset_cls and not base.has_class_token:
        raise ValueError("TAFT: reset_cls=True needs a model with a class token (class_token=True)")
    for path in _linearized_norm_paths(base, k):
        norm = base.get_submodule(path)
        if isinstance(norm, nn.Identity):
            continue
        if not isinstance(norm, nn.LayerNorm) or norm.weight is None or norm.bias is None:
            what = type(norm).__name__ + (" without affine weight and bias" if isinstance(norm, nn.LayerNorm) else "")
            raise ValueError(f"TAFT does not support '{path}' ({what}): its linearization needs a LayerNorm "
                             f"with elementwise affine weight and bias")


def _linearized_norm_paths(base: nn.Module, k: int) -> list[str]:
    """Module paths of the norms TAFT-k linearizes: each tuned block's norms, the final norms."""
    depth = len(base.blocks)
    paths = [f"blocks.{i}.{n}" for i in range(depth - k, depth)
             for n in ("norm1", "norm2", "attn.q_norm", "attn.k_norm") if _has_path(base, f"blocks.{i}.{n}")]
    return paths + [n for n in ("norm", "fc_norm") if _has_path(base, n)]


def _has_path(base: nn.Module, path: str) -> bool:
    try:
        base.get_submodule(path)
    except AttributeError:
        return False
    return True


def is_distilled(base: nn.Module) -> bool:
    """True for DeiT's ``VisionTransformerDistilled`` (class and distillation tokens, two heads)."""
    from timm.models.deit import VisionTransformerDistilled

    return isinstance(base, VisionTransformerDistilled)


def _stochastic_modules(base: nn.Module) -> list[str]:
    """Names of modules that are random in train mode (dropout, drop path, patch dropout)."""
    return [name for name, m in base.named_modules() if dropout_rate(m) > 0.0]


def _build_prefix(base: nn.Module, n_prefix: int) -> nn.Module:
    """A frozen copy of `base` that stops after block n_prefix − 1 (no norm, pool or head).

    The deepcopy memo maps the linearized modules to placeholders, so they are never copied.
    """
    heads = [base.head, base.head_dist] if is_distilled(base) else [base.head]
    skip = [*base.blocks[n_prefix:], base.norm, base.fc_norm, base.head_drop, *heads]
    memo = {id(m): nn.Identity() for m in skip}
    prefix = copy.deepcopy(base, memo)
    prefix.blocks = nn.Sequential(*list(prefix.blocks)[:n_prefix])
    prefix.norm, prefix.fc_norm, prefix.head_drop, prefix.head = (nn.Identity() for _ in range(4))
    if is_distilled(base):
        prefix.head_dist = nn.Identity()
    prefix.requires_grad_(False)
    return prefix.eval()


def _reset_(modules: list[nn.Module], seed: int) -> None:
    """Re-initialize `modules` in place with timm's ViT init under `seed`, drawn on CPU."""
    from timm.models.vision_transformer import init_weights_vit_timm, named_apply

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in modules:
            device = next(iter(m.parameters()), torch.empty(0)).device
            m.cpu()
            named_apply(partial(init_weights_vit_timm, needs_reset=True), m, include_root=True)
            m.to(device)


class TangentViT(nn.Module):
    """A timm ViT linearized around its base weights in the last k blocks, norm and head.

    Args:
        base: timm ``VisionTransformer`` (not modified; its weights are copied).
        k: number of linearized blocks, 1..depth.
        reset: re-initialize the linearized blocks, norms and head with `reset_seed` (PT=F).
        reset_seed: seed of the reset; equal seeds give equal weights in every shard.
        reset_cls: also replace and linearize the class-token row (see module docstring).
        jvp_only: predict J·Δw only, without f_w(x).
        delta_init_std: std of the Δ init (0 gives Δ = 0; drawn from a CPU generator
            seeded with reset_seed + 1 so it is reproducible).
    """

    def __init__(self, base: nn.Module, k: int, reset: bool = False, reset_seed: int = 0,
                 reset_cls: bool = False, jvp_only: bool = False, delta_init_std: float = 0.0) -> None:
        super().__init__()
        check_supported(base, k, reset_cls)
        self.depth = len(base.blocks)
        self.k = k
        self.reset, self.reset_seed, self.reset_cls = bool(reset), int(reset_seed), bool(reset_cls)
        self.jvp_only = bool(jvp_only)
        self.delta_init_std = float(delta_init_std)
        self.global_pool = base.global_pool
        self.num_prefix_tokens = base.num_prefix_tokens
        self.pool_include_prefix = bool(base.pool_include_prefix)
        self.distilled = is_distilled(base)
        self._stochastic = _stochastic_modules(base)
        n_prefix = self.depth - k

        self.prefix_net = _build_prefix(base, n_prefix)
        lin = copy.deepcopy(nn.ModuleDict({
            "blocks": nn.ModuleList(base.blocks[n_prefix:]), "norm": base.norm,
            "fc_norm": base.fc_norm, "head": base.head, **({"head_dist": base.head_dist} if self.distilled else {})}))
        if reset:
            _reset_(list(lin.values()), self.reset_seed)
        gen = torch.Generator().manual_seed(self.reset_seed + 1) if delta_init_std > 0 else None

        self.blocks = nn.ModuleList(TangentBlock(b, delta_init_std, gen) for b in lin["blocks"])
        self.norm = self._tangent_norm(lin["norm"], "norm", delta_init_std, gen)
        self.fc_norm = self._tangent_norm(lin["fc_norm"], "fc_norm", delta_init_std, gen)
        self.head = TangentLinear(lin["head"], delta_init_std, gen)
        # DeiT's distillation-token head (None otherwise); created after `head` so the Δ init
        # draws of every other module are those of a plain ViT.
        self.head_dist = TangentLinear(lin["head_dist"], delta_init_std, gen) if self.distilled else None
        if reset_cls:
            ref = base.cls_token
            cls = torch.randn(ref.shape, generator=torch.Generator().manual_seed(self.reset_seed + 2),
                              dtype=torch.float64) * _CLS_RESET_STD
            self.register_buffer("cls_token", cls.to(device=ref.device, dtype=ref.dtype))  # (1, 1, D)
            self.cls_delta = nn.Embedding(1, ref.shape[-1], device=ref.device, dtype=ref.dtype)
            _init_delta_([self.cls_delta.weight], delta_init_std, gen)
        else:
            self.register_buffer("cls_token", None)
            self.cls_delta = None
        self._timm_prefix = {f"blocks.{j}.": f"blocks.{n_prefix + j}." for j in range(k)}

    @staticmethod
    def _tangent_norm(norm: nn.Module, name: str, std: float,
                      gen: Optional[torch.Generator]) -> Optional[TangentLayerNorm]:
        if isinstance(norm, nn.Identity):
            return None
        try:
            return TangentLayerNorm(norm, std, gen)
        except (TypeError, ValueError) as e:
            raise ValueError(f"TAFT: unsupported {name}: {e}") from e

    def train(self, mode: bool = True) -> "TangentViT":
        """Train or eval mode for the linearized part; the frozen prefix stays in eval mode whatever
        the caller asks. A prefix in train mode would normalise a BatchNorm stem (timm's
        `vit_base_mci_224`) by the batch and update its running statistics: the linearization point
        would move (0.47 in the logits at k = 1) under every caller of `.train()`, not only the DP
        trainers that correct for it (`dp/frozen_modes.py`).

        Args:
            mode: True for train mode, False for eval mode (`eval()` calls this).
        """
        super().train(mode)
        self.prefix_net.eval()
        return self

    # ---- forward -----------------------------------------------------------------
    def _check_mode(self) -> None:
        if self.training and self._stochastic:
            raise RuntimeError("TAFT: dropout/drop-path > 0 in train mode is unsupported "
                               f"(modules: {self._stochastic[:5]}); call .eval() as the authors do")

    @torch.no_grad()
    def prefix(self, x: torch.Tensor) -> torch.Tensor:
        """Frozen prefix features h (B, N, D): the input of the first linearized block."""
        self._check_mode()
        return self.prefix_net.forward_features(x)

    def forward_from_prefix(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from cached prefix features h (B, N, D)."""
        self._check_mode()
        t: Tangent = None
        if self.cls_delta is not None:
            B, N, D = h.shape
            h = torch.cat([self.cls_token.expand(B, 1, D), h[:, 1:]], dim=1)
            idx = torch.zeros(B, 1, dtype=torch.long, device=h.device)
            with tangent_grad():
                t = torch.cat([self.cls_delta(idx), h.new_zeros(B, N - 1, D)], dim=1)  # Δc on row 0 only
        for blk in self.blocks:
            h, t = blk(h, t)
        if self.norm is not None:
            h, t = self.norm(h, t)
        if self.head_dist is not None:
            # timm's eval forward: mean of the class-token head and the distillation-token head.
            y, dy = self.head(h[:, 0], None if t is None else t[:, 0])
            yd, dyd = self.head_dist(h[:, 1], None if t is None else t[:, 1])
            y, dy = (y + yd) / 2, (dy + dyd) / 2
        else:
            h, t = self._pool(h), self._pool(t)
            if self.fc_norm is not None:
                h, t = self.fc_norm(h, t)
            y, dy = self.head(h, t)
        return self.logits(y, dy)

    def logits(self, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        """The output from the head's primal y and tangent dy: f + J·Δw, or J·Δw alone (`jvp_only`)."""
        if self.jvp_only:
            # Under `primal_gradient` the value is J·Δw and the gradient flows through f_w.
            return dy + (y - y.detach()) if primal_grad_enabled() else dy
        return y + dy

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        if self.global_pool == "token":
            return x[:, 0]
        if not self.pool_include_prefix:
            x = x[:, self.num_prefix_tokens:]
        return x.mean(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from images x (B, C, H, W)."""
        return self.forward_from_prefix(self.prefix(x))

    # ---- parameters ----------------------------------------------------------------
    def named_delta_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, Δ parameter) pairs: every trainable parameter outside the frozen prefix."""
        return [(n, p) for n, p in self.named_parameters() if not n.startswith("prefix_net.")]

    def delta_parameters(self) -> list[nn.Parameter]:
        """The Δ parameters (the only ones that train)."""
        return [p for _, p in self.named_delta_parameters()]

    def delta_state_dict(self) -> dict[str, torch.Tensor]:
        """Detached copies of the Δ parameters, keyed by their names in this module."""
        return {n: p.detach().clone() for n, p in self.named_delta_parameters()}

    @torch.no_grad()
    def load_delta_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load Δ parameters; keys and shapes must match exactly."""
        own = dict(self.named_delta_parameters())
        missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
        if missing or unexpected:
            raise KeyError(f"load_delta_state_dict: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for n, p in own.items():
            if tuple(sd[n].shape) != tuple(p.shape):
                raise ValueError(f"load_delta_state_dict: {n} has shape {tuple(sd[n].shape)}, expected {tuple(p.shape)}")
            p.copy_(sd[n].to(device=p.device, dtype=p.dtype))

    def linearization_pairs(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """timm parameter name -> (base value w, Δ parameter) for every linearized parameter.

        The reset class-token row, which is no timm parameter, is keyed 'cls_input'
        (values shaped (1, 1, D))."""
        out = {}
        for path, m in self.named_modules():
            if not hasattr(m, "pairs") or path.startswith("prefix_net"):
                continue
            timm_path = path
            for ours, theirs in self._timm_prefix.items():
                if path.startswith(ours):
                    timm_path = theirs + path[len(ours):]
                    break
            for local, pair in m.pairs().items():
                out[f"{timm_path}.{local}"] = pair
        if self.cls_delta is not None:
            out["cls_input"] = (self.cls_token, self.cls_delta.weight.view(1, 1, -1))
        return out

    def base_delta_parameters(self) -> list[tuple[torch.Tensor, nn.Parameter]]:
        """(base tensor w, its Δ parameter) for every linearized tensor; ∂f/∂w = ∂f_lin/∂Δw, shapes
        equal up to the reset class token's (1, 1, D) vs (1, D)."""
        out = []  # every step calls this: walk only the linearized modules, no names
        for part in (self.blocks, self.norm, self.fc_norm, self.head, self.head_dist):
            for m in () if part is None else part.modules():
                if hasattr(m, "pairs"):
                    out.extend(m.pairs().values())
        if self.cls_delta is not None:
            out.append((self.cls_token, self.cls_delta.weight))
        return out

    def base_delta_names(self) -> list[tuple[str, str]]:
        """(base buffer name, Δ parameter name) for every linearized tensor, as `base_delta_parameters`."""
        delta_name = {id(p): n for n, p in self.named_delta_parameters()}
        buf_name = {id(b): n for n, b in self.named_buffers()}
        return [(buf_name[id(w)], delta_name[id(d)]) for w, d in self.base_delta_parameters()]

    def linearization_id(self) -> str:
        """Digest of everything fixing the linearization point: the frozen prefix, the base
        weights of the linearized part (after any reset), the TAFT settings and the
        architecture's configuration (`module_config`: activation, LayerNorm eps, attention
        scale, ...; equal weights under another configuration are another function)."""
        delta_names = {n for n, _ in self.named_delta_parameters()}
        base = {n: v for n, v in self.state_dict().items() if n not in delta_names}
        meta = {"k": self.k, "depth": self.depth, "reset": self.reset, "reset_seed": self.reset_seed,
                "reset_cls": self.reset_cls, "jvp_only": self.jvp_only, "architecture": module_config(self)}
        return hashlib.sha256((state_digest(base) + json.dumps(meta, sort_keys=True)).encode()).hexdigest()

