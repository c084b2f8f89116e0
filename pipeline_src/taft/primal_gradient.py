"""The gradient of a tangent model's loss w.r.t. Δw, taken through the primal network.

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and Removal",
ICLR 2024 (TAFT). The tangent model f_lin(x; Δw) = f_w(x) + J_w(x)·Δw is linear in Δw, so

    ∇_Δw ℓ(f_lin) = J_w(x)ᵀ · ∇ℓ(f_lin) = ∇_w ℓ(f_w(x) + c),   c = J_w(x)·Δw held constant:

the ordinary backward of the *base* network at w (what non-linear fine-tuning runs), seeded
with the loss gradient at the linearized output. So the tangent is computed without autograd
(no graph, no double-backward kernels of the LayerNorm/softmax/GELU JVPs), the primal ops are
recorded as in NLFT, and ∇_w lands on the frozen base tensors, from where it is moved to Δw.

Not for DP: Opacus' hooks and our per-example norm rules need the Δ modules on the autograd
path (`jvp_layers` module docstring), so DP training keeps the tangent graph.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch
import torch.nn as nn

from pipeline_src.taft.jvp_layers import primal_grad_mode


@contextlib.contextmanager
def primal_gradient(model: nn.Module, pairs: Optional[list[tuple[torch.Tensor, nn.Parameter]]] = None
                    ) -> Iterator[list[tuple[torch.Tensor, nn.Parameter]]]:
    """Within: the tangent ops run without autograd and the base tensors require grad.

    Yields the (base, Δ) pairs; call `move_gradients_` after the backward. On exit the base
    tensors are frozen again and their `.grad` cleared.

    Args:
        model: a `TangentViT`.
        pairs: its `base_delta_parameters()`, looked up once per training run (None: here).
    """
    pairs = model.base_delta_parameters() if pairs is None else pairs
    for w, _ in pairs:
        w.requires_grad_(True)
    try:
        with primal_grad_mode():
            yield pairs
    finally:
        for w, _ in pairs:
            w.requires_grad_(False)
            w.grad = None


def move_gradients_(pairs: list[tuple[torch.Tensor, nn.Parameter]]) -> None:
    """Add each base tensor's gradient to its Δ parameter's `.grad` (zeros where none came)."""
    for w, d in pairs:
        g = torch.zeros_like(d) if w.grad is None else w.grad.view_as(d)
        d.grad = g if d.grad is None else d.grad + g
        w.grad = None


def primal_gradient_backward(model: nn.Module, loss_of: Callable[[], torch.Tensor],
                             pairs: Optional[list[tuple[torch.Tensor, nn.Parameter]]] = None) -> torch.Tensor:
    """Run `loss_of()` (a forward of `model` and its loss) and its backward through the primal
    network, leaving ∇_Δw in the Δ parameters' `.grad`; returns the (detached) loss.

    Args:
        model: a `TangentViT`.
        loss_of: computes the loss from `model`'s forward; called once, inside the context.
        pairs: as `primal_gradient`'s.
    """
    with primal_gradient(model, pairs) as pairs:
        loss = loss_of()
        loss.backward()
        move_gradients_(pairs)
    return loss.detach()
