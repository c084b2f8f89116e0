"""DP-SGD noise for book-keeping clipping in one persistent flat buffer.

DP-SGD (Abadi et al. 2016, "Deep learning with differential privacy") adds N(0, σ²C²) to the
clipped gradient sum and divides by the expected batch size B. Opacus' optimizer does this per
parameter with a deep copy of the gradient, a fresh normal tensor, their sum and an in-place
division: four allocations and five passes per parameter per step. Here each parameter's noise is
drawn straight into its slice of a flat buffer that lives across steps, the clipped sum is added
in place, and one division scales the whole buffer: no allocation, three passes, and p.grad are
views of the buffer. The draws are the same calls on the same generator as Opacus' (a contiguous
tensor of the same size, in the same order), so the noised gradients equal Opacus' bit for bit.

The noise comes only from the generator handed in (`secret_randomness.secret_generator` unless a
test passes its own); the global generator is never touched. Opacus' accounting hook, skip logic
and the wrapped optimizer's update are unchanged. Used by the "bk" mode (`private_training`).
"""
from __future__ import annotations

import torch
from opacus.optimizers import DPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed


class FlatNoiseDPOptimizer(DPOptimizerFastGradientClipping):
    """`DPOptimizerFastGradientClipping` with noise, sum and scaling in one flat buffer.

    Args: as `DPOptimizerFastGradientClipping` (optimizer, noise_multiplier, max_grad_norm,
        expected_batch_size, loss_reduction, generator, secure_mode). With secure_mode, or with
        parameters of several dtypes or devices, it falls back to Opacus' per-parameter noise.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._flat: torch.Tensor | None = None
        self._fused_this_step = False

    def _views(self) -> list[torch.Tensor] | None:
        """Slices of the persistent flat buffer, one per parameter; None if it cannot be one buffer."""
        params = self.params
        if self.secure_mode or len({(p.dtype, p.device) for p in params}) != 1:
            return None
        total = sum(p.numel() for p in params)
        if self._flat is None or self._flat.numel() != total:
            self._flat = torch.empty(total, dtype=params[0].dtype, device=params[0].device)
        return list(self._flat.split([p.numel() for p in params]))

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Clear gradients; `p.grad` is always set to None, so that a gradient never aliases the
        flat buffer that the next step's noise overwrites."""
        super().zero_grad(set_to_none=True)

    def accumulate(self) -> None:
        """`p.summed_grad` = `p.grad` without Opacus' deep copy (the clipped sum is a fresh tensor)."""
        for p in self.params:
            if p.summed_grad is not None:
                p.summed_grad.add_(p.grad)
            else:
                p.summed_grad = p.grad

    def add_noise(self) -> None:
        """p.grad = (summed + N(0, σ²C²)) / B in the flat buffer (B: expected batch size, for "mean")."""
        views = self._views()
        self._fused_this_step = views is not None
        if views is None:
            return super().add_noise()
        std = getattr(self, "_adjusted_noise_multiplier", self.noise_multiplier) * self.max_grad_norm
        for p, view in zip(self.params, views):
            _check_processed_flag(p.summed_grad)
            if std > 0:
                view.normal_(0.0, std, generator=self.generator)  # Opacus' draw for this parameter
            else:
                view.zero_()
            view.add_(p.summed_grad.reshape(-1))
            p.grad = view.view_as(p)
            _mark_as_processed(p.summed_grad)
        if self.loss_reduction == "mean":
            self._flat.div_(self.expected_batch_size * self.accumulated_iterations)

    def scale_grad(self) -> None:
        """Already scaled in `add_noise` when the flat buffer was used."""
        if not self._fused_this_step:
            super().scale_grad()
