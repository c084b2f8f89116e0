"""Losses and Δ regularizers for training tangent models.

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and
Removal", ICLR 2024: the rescaled square loss (RSL, after Hui & Belkin 2021,
"Evaluation of neural architectures trained with square loss vs cross-entropy")
    L = (1/K)·(α·(f_y − κ)² + Σ_{i≠y} f_i²)
with an L2 penalty on Δw or a projection of Δw onto a ball of radius R.
Cross-entropy and MSE to the one-hot target are kept for comparison.
The authors' code uses α = 1 (MSE to κ·one-hot) and κ = 15.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

LossFn = Callable[..., torch.Tensor]
_LOSSES: dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Register a loss `fn(logits, labels, reduction=...)` under `name`; duplicates are refused."""
    def wrap(fn: LossFn) -> LossFn:
        if name in _LOSSES:
            raise KeyError(f"loss {name!r} is already registered")
        _LOSSES[name] = fn
        return fn
    return wrap


def _reduce(per_sample: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "sum":
        return per_sample.sum()
    if reduction == "none":
        return per_sample
    raise ValueError(f"unknown reduction {reduction!r} (mean, sum or none)")


@register_loss("rsl")
def rescaled_square_loss(logits: torch.Tensor, labels: torch.Tensor, alpha: float = 1.0, kappa: float = 15.0,
                         reduction: str = "mean") -> torch.Tensor:
    """Rescaled square loss (1/K)·(α·(f_y − κ)² + Σ_{i≠y} f_i²) per sample.

    Args:
        logits: (B, K).
        labels: (B,) integer classes.
        alpha: weight of the true-class term.
        kappa: target value of the true-class logit.
        reduction: 'mean' over the batch, 'sum' or 'none'.
    """
    K = logits.shape[-1]
    f_y = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)  # (B,)
    per = (logits.square().sum(-1) - f_y.square() + alpha * (f_y - kappa).square()) / K
    return _reduce(per, reduction)


@register_loss("mse")
def mse_one_hot(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """(1/K)·‖f − onehot(y)‖² per sample (RSL with α = κ = 1).

    Args:
        logits: (B, K).
        labels: (B,) integer classes.
        reduction: 'mean' over the batch, 'sum' or 'none'.
    """
    target = F.one_hot(labels.long(), logits.shape[-1]).to(logits.dtype)
    return _reduce((logits - target).square().mean(-1), reduction)


@register_loss("ce")
def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Softmax cross-entropy per sample.

    Args:
        logits: (B, K).
        labels: (B,) integer classes.
        reduction: 'mean' over the batch, 'sum' or 'none'.
    """
    return _reduce(F.cross_entropy(logits, labels.long(), reduction="none"), reduction)


def get_loss(name: str, alpha: Optional[float] = None, kappa: Optional[float] = None) -> LossFn:
    """The loss `fn(logits, labels, reduction='mean')` registered as `name`, with α, κ bound for 'rsl'.

    Args:
        name: 'rsl', 'mse' or 'ce'.
        alpha: RSL α (default 1); must be None for other losses.
        kappa: RSL κ (default 15); must be None for other losses.
    """
    if name not in _LOSSES:
        raise KeyError(f"unknown loss {name!r}; registered: {sorted(_LOSSES)}")
    fn = _LOSSES[name]
    if name == "rsl":
        a = 1.0 if alpha is None else float(alpha)
        kp = 15.0 if kappa is None else float(kappa)
        return lambda logits, labels, reduction="mean": fn(logits, labels, a, kp, reduction)
    if alpha is not None or kappa is not None:
        raise ValueError(f"loss {name!r} takes no alpha/kappa (got alpha={alpha}, kappa={kappa})")
    return fn


def _params(model_or_params: "nn.Module | Iterable[torch.Tensor]") -> list[torch.Tensor]:
    if hasattr(model_or_params, "delta_parameters"):
        return list(model_or_params.delta_parameters())
    if isinstance(model_or_params, nn.Module):
        raise TypeError("expected a TangentViT (with delta_parameters()) or an iterable of tensors")
    return list(model_or_params)


def delta_l2_penalty(model_or_params: "nn.Module | Iterable[torch.Tensor]", squared: bool = True) -> torch.Tensor:
    """‖Δw‖₂² (default, smooth at Δ = 0) or ‖Δw‖₂ (squared=False, as in the authors' code)
    over all Δ parameters taken together.

    Args:
        model_or_params: a TangentViT or an iterable of Δ tensors.
        squared: return the squared norm.
    """
    params = _params(model_or_params)
    sq = torch.stack([p.square().sum() for p in params]).sum()
    return sq if squared else sq.sqrt()


@torch.no_grad()
def add_l2_penalty_gradient_(params: list[torch.Tensor], coef: float) -> torch.Tensor:
    """Add ∇ of `coef`·‖Δw‖₂² (2·coef·Δ) to each Δ's `.grad` (None: zeros first) and return the
    penalty's value: the same gradient as `delta_l2_penalty` in the loss gives through autograd,
    in two fused ops instead of a square, a sum and their backward per tensor.

    Args:
        params: the Δ tensors (e.g. `model.delta_parameters()`), their data gradient already in `.grad`.
        coef: the penalty's coefficient.
    """
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    torch._foreach_add_([p.grad for p in params], params, alpha=2.0 * coef)
    return coef * torch.stack(torch._foreach_norm(params)).square().sum()


@torch.no_grad()
def project_to_ball(params: "nn.Module | Iterable[torch.Tensor]", radius: float) -> float:
    """Project Δw (all tensors jointly) in place onto {‖Δw‖₂ ≤ radius}; return the norm before.

    Args:
        params: a TangentViT or an iterable of Δ tensors.
        radius: ball radius R > 0.
    """
    if radius <= 0:
        raise ValueError(f"project_to_ball: radius must be > 0, got {radius}")
    params = _params(params)
    norm = float(torch.stack([p.square().sum() for p in params]).sum().sqrt())
    if norm > radius:
        for p in params:
            p.mul_(radius / norm)
    return norm
