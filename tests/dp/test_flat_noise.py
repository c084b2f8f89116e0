"""Flat-buffer DP-SGD noise (Abadi et al. 2016): the noised, scaled gradients and the SGD update
equal Opacus' DPOptimizerFastGradientClipping bit for bit on the same generator, over several
steps; the noise comes only from the generator passed in; mixed dtypes fall back to Opacus."""
from __future__ import annotations

import pytest
import torch
from opacus.optimizers import DPOptimizerFastGradientClipping
from torch import nn

from pipeline_src.dp.flat_noise import FlatNoiseDPOptimizer

# compares results of different paths (batches, caches, threads): bit-equality only where the
# same kernels see the same operands, checked on any CPU (tests/rounding_guard.py)
pytestmark = pytest.mark.rounding_guard


def _model(dtype=torch.float32, mixed=False) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(7, 33), nn.LayerNorm(33), nn.Linear(33, 5, bias=False)).to(dtype)
    if mixed:
        m[2].double()
    return m


def _run(cls, dtype=torch.float32, mixed=False, steps=3, sigma=1.3):
    model = _model(dtype, mixed)
    opt = cls(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), noise_multiplier=sigma, max_grad_norm=0.7,
              expected_batch_size=6, loss_reduction="mean", generator=torch.Generator().manual_seed(11))
    grads = torch.Generator().manual_seed(5)
    seen, rng = [], torch.get_rng_state()
    for _ in range(steps):
        opt.zero_grad()
        for p in model.parameters():  # what book-keeping leaves: the clipped sum in p.grad
            p.grad = torch.randn(p.shape, generator=grads, dtype=torch.float64).to(p.dtype)
        opt.step()
        seen.append([p.grad.clone() for p in model.parameters()])
    assert torch.equal(torch.get_rng_state(), rng)  # the noise never draws from the global generator
    return model, opt, seen


@pytest.mark.parametrize("dtype,mixed", [(torch.float32, False), (torch.float64, False), (torch.float32, True)])
def test_equals_opacus_bit_for_bit(dtype, mixed):
    ours, opt, g_ours = _run(FlatNoiseDPOptimizer, dtype, mixed)
    ref, _, g_ref = _run(DPOptimizerFastGradientClipping, dtype, mixed)
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    for step_ours, step_ref in zip(g_ours, g_ref):
        for a, b in zip(step_ours, step_ref):
            assert torch.equal(a, b)
    fused = opt._flat is not None
    assert fused == (not mixed)
    if fused:  # p.grad are views of the one buffer
        base = opt._flat.untyped_storage().data_ptr()
        assert all(p.grad.untyped_storage().data_ptr() == base for p in ours.parameters())


def test_noise_scale_and_zero_sigma():
    _, _, seen = _run(FlatNoiseDPOptimizer, steps=1, sigma=0.0)
    _, _, ref = _run(DPOptimizerFastGradientClipping, steps=1, sigma=0.0)
    assert all(torch.equal(a, b) for a, b in zip(seen[0], ref[0]))  # σ = 0: the clipped mean alone
    big = nn.Linear(1000, 1000, bias=False)
    opt = FlatNoiseDPOptimizer(torch.optim.SGD(big.parameters(), lr=0.0), noise_multiplier=2.0, max_grad_norm=0.5,
                               expected_batch_size=4, loss_reduction="mean", generator=torch.Generator().manual_seed(0))
    big.weight.grad = torch.zeros_like(big.weight)
    opt.step()
    assert big.weight.grad.std().item() == pytest.approx(2.0 * 0.5 / 4, rel=0.01)  # σC/B
