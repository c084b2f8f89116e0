"""AdditiveDelta: a trainable offset added to a frozen tensor (e.g. a CLS-token or
position-embedding delta), held in its own module so DP norm samplers can see it.

timm's VisionTransformer owns `cls_token`/`pos_embed` directly; training them makes
Opacus vmap the whole model (design notes §4 "DP"). A delta in a small module keeps
the per-example gradient cheap: it is the gradient of the output summed over the
dimensions the delta is broadcast along (Lee & Kifer 2021, "Scaling up differentially
private deep learning with fast per-example gradient clipping", per-layer rules).
"""
from __future__ import annotations

import torch
from torch import nn


class AdditiveDelta(nn.Module):
    """y = x + delta, with `delta` broadcast against the non-batch dims of x.

    Args:
        shape: shape of the delta; it must broadcast against x.shape[1:]
            (e.g. (1, d) for a per-channel offset, (T, d) for a position delta).
        init_std: std of the initial delta (0 gives an exact no-op at start).
    """

    def __init__(self, shape: tuple[int, ...], init_std: float = 0.0) -> None:
        super().__init__()
        self.delta = nn.Parameter(torch.randn(shape) * init_std if init_std > 0 else torch.zeros(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delta.dim() > x.dim() - 1:
            raise ValueError(f"AdditiveDelta: delta of shape {tuple(self.delta.shape)} has more dims than "
                             f"the non-batch dims of input {tuple(x.shape)}")
        return x + self.delta

    def extra_repr(self) -> str:
        return f"shape={tuple(self.delta.shape)}"


def additive_delta_grad_sample(delta: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """Per-example gradient of `delta` from the output gradient (B, *x.shape[1:]).

    Args:
        delta: the delta parameter.
        grad_out: gradient of the loss w.r.t. the module output, batch first.
    """
    b = grad_out.shape[0]
    lead = grad_out.dim() - 1 - delta.dim()  # dims of x not covered by delta: summed
    g = grad_out.sum(dim=tuple(range(1, 1 + lead))) if lead > 0 else grad_out
    # dims where delta has size 1 but x does not were broadcast: sum them back
    keep = [i + 1 for i, s in enumerate(delta.shape) if s == 1 and g.shape[i + 1] != 1]
    if keep:
        g = g.sum(dim=tuple(keep), keepdim=True)
    return g.reshape(b, *delta.shape)
