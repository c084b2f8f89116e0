"""`torch.optim.AdamW` on its fused kernel: one kernel updates every parameter and both moments.

Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019 (AdamW). torch's CPU
default is the single-tensor path, a dozen Python-dispatched ops per parameter tensor per step;
on a small ViT that is most of the step's optimizer time. The fused kernel computes the same
update elementwise, equal to the single-tensor path within an ulp, not bit for bit
(`tests/optim/test_adamw.py`). Measured on the default study's ViT (depth 4, dim 64, one
CPU thread, interleaved in one process, 2026-11-29): a full fine-tuning epoch 0.36 → 0.32 s, a
TAFT-4 epoch 0.57 → 0.54 s (docs/performance.md). Parameters on a device or of a dtype torch has
no fused kernel for fall back to torch's own default.
"""
from __future__ import annotations

from typing import Iterable

import torch

from pipeline_src.optim.stacked_adamw import ADAM_BETAS, ADAM_EPS


def fused_supported(params: list[torch.Tensor]) -> bool:
    """True when torch has a fused AdamW kernel for every parameter (its device, a float dtype)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = _get_fused_kernels_supported_devices()
    return bool(params) and all(p.device.type in devices and p.is_floating_point() for p in params)


def adamw(params: Iterable[torch.Tensor], *, lr: float, weight_decay: float,
          betas: tuple[float, float] = ADAM_BETAS, eps: float = ADAM_EPS) -> torch.optim.AdamW:
    """`torch.optim.AdamW(params, ...)`, fused where torch can.

    Args:
        params: the parameters to train.
        lr: learning rate.
        weight_decay: decoupled weight decay (no default: torch's is 0.01, this package's steps say theirs).
        betas, eps: Adam's moment decays and denominator epsilon (torch's defaults).
    """
    params = list(params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=True if fused_supported(params) else None)
