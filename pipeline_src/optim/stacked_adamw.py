"""One AdamW step for many models at once, stored stacked along a leading member axis.

Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019 (AdamW). The
arithmetic is `torch.optim.AdamW`'s single-tensor path, applied to (M, ...) tensors with
per-member learning rates, weight decays and step counts broadcast over the member axis.
Used by the vectorized tangent trainer (`taft/train.py`: N shards, each with its own batch
schedule, so some members sit a step out) and by the LAST grid (`last/grid.py`: M side
networks in lockstep).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

ADAM_BETAS = (0.9, 0.999)  # torch.optim.AdamW's defaults
ADAM_EPS = 1e-8

PerMember = Union[float, Tensor]  # a float, or one value per member: shape (M,) or (M, 1)


def _per_member(x: PerMember, like: Tensor) -> PerMember:
    """A per-member tensor reshaped to broadcast over `like` (M, ...); a float as it is."""
    if not torch.is_tensor(x):
        return x
    return x.reshape((-1,) + (1,) * (like.dim() - 1)).to(device=like.device, dtype=like.dtype)


@torch.no_grad()
def stacked_adamw_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: "int | Tensor",
                   lr: PerMember, weight_decay: PerMember = 0.0, active: Optional[Tensor] = None) -> None:
    """Update `param`, `exp_avg` and `exp_avg_sq` (each (M, ...)) in place by one AdamW step.

    Args:
        param: the stacked parameter, member axis first.
        grad: its gradient, same shape.
        exp_avg, exp_avg_sq: Adam's first and second moments, same shape.
        step: the step count including this step: one int for all members, or (M,).
        lr: learning rate, one float or one per member.
        weight_decay: decoupled weight decay, one float or one per member.
        active: (M,) bool; members that are False keep their parameter and moments unchanged
            (their `step` is not advanced by the caller either). None: every member steps.
    """
    b1, b2 = ADAM_BETAS
    if torch.is_tensor(step):
        t = step.to(torch.float64).clamp(min=1)  # a member that has not stepped yet is masked out
        bc1, bc2_sqrt = _per_member(1 - b1 ** t, param), _per_member((1 - b2 ** t).sqrt(), param)
    else:
        bc1, bc2_sqrt = 1 - b1 ** step, (1 - b2 ** step) ** 0.5
    lr, weight_decay = _per_member(lr, param), _per_member(weight_decay, param)
    if active is None:
        p, m, v = param, exp_avg, exp_avg_sq
    else:  # update copies, then keep the active members' rows
        p, m, v = param.clone(), exp_avg.clone(), exp_avg_sq.clone()
    if torch.is_tensor(weight_decay) or weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    m.lerp_(grad, 1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (v.sqrt() / bc2_sqrt).add_(ADAM_EPS)
    p.sub_((lr / bc1) * m / denom)
    if active is not None:
        keep = active.reshape((-1,) + (1,) * (param.dim() - 1)).to(param.device)  # (M, 1, ...) bool
        for dst, new in ((param, p), (exp_avg, m), (exp_avg_sq, v)):
            dst.copy_(torch.where(keep, new, dst))
