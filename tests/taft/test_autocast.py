"""TAFT under bfloat16 autocast (`train.precision: bfloat16`).

The closed-form JVP layers call in-place and aten ops (``addmm_``, ``baddbmm_``,
``native_layer_norm_backward``, ``gelu_backward``) that autocast does not cast, so mixed
bfloat16/float32 operands must be matched by the layers themselves (a CUDA run of the ViT-B/16
GPU study failed here with "self and mat2 must have the same dtype"). CPU autocast takes the same
code paths, and CUDA autocast's float32 policy for softmax (the ViT-B/16 run's second failure:
"expected input and grad types to match") is emulated by patching softmax to float32; the
reference is the same model in float32.
"""
from __future__ import annotations

import pytest
import torch

from pipeline_src.taft import TangentViT
from tests.taft.test_model import CONFIGS, images, make_base


def _loss_and_grads(model: TangentViT, x: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(x)
    out.float().square().sum().backward()
    return out.detach().float(), [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                                  for p in model.parameters()]


@pytest.fixture(params=["cpu_policy", "cuda_softmax_policy"])
def autocast_policy(request, monkeypatch):
    """CPU autocast as it is, or with softmax in float32 as CUDA autocast runs it."""
    if request.param == "cuda_softmax_policy":
        softmax = torch.Tensor.softmax

        def float32_softmax(self, *args, **kwargs):
            out = softmax(self, *args, **kwargs)
            return out.float() if torch.is_autocast_enabled("cpu") else out

        monkeypatch.setattr(torch.Tensor, "softmax", float32_softmax)
    return request.param


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_bfloat16_autocast_matches_float32(cfg: str, k: int, autocast_policy: str) -> None:
    model = TangentViT(make_base(**CONFIGS[cfg]), k, delta_init_std=0.05)
    x = images().float()
    ref, ref_grads = _loss_and_grads(model, x, bf16=False)
    out, grads = _loss_and_grads(model, x, bf16=True)
    assert float((out - ref).norm() / ref.norm()) < 0.05
    flat, ref_flat = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in ref_grads])
    assert torch.isfinite(flat).all()
    assert float(torch.nn.functional.cosine_similarity(flat, ref_flat, dim=0)) > 0.99
