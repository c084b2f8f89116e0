"""Full-batch DP-GD (the TAFT paper's DP protocol, App. A): the clipped sum against per-example
clipping by micro-batches of size one, one step against the formula on the same noise, and the
accounting against Opacus' RDP accountant (q = 1) and the exact Gaussian-mechanism bound."""
from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import RDPAccountant

from pipeline_src.dp import BookKeepingModule, apply_regime, nlft_scope
from pipeline_src.dp.budget import plan_budget
from pipeline_src.dp.full_batch import clipped_gradient_sum, train_private_full_batch
from tests.conftest import tiny_vit
from tests.dp.test_reference import ce, microbatch_grads


def _data(n: int = 11, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, 16, dtype=torch.float64, generator=g), torch.randint(0, 5, (n,), generator=g)


def _reference_clipped_sum(model, x, y, c: float) -> dict[str, torch.Tensor]:
    """Σ_i min(1, C/(‖g_i‖ + 1e-6)) g_i from B separate backward passes (Opacus' clipping factor)."""
    per = microbatch_grads(model, x, y)
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per.values()))
    coef = (c / (norms + 1e-6)).clamp(max=1.0)
    assert (coef < 1).any(), "the bound must bite"
    return {n: torch.einsum("b,b...->...", coef, g) for n, g in per.items()}


@pytest.mark.parametrize("micro", [1, 4, 11, 64])
def test_clipped_full_batch_sum_equals_micro_batches_of_one(micro):
    model = tiny_vit(train=True)
    apply_regime(model, "full", nlft_scope(model))
    x, y = _data()
    ref = _reference_clipped_sum(model, x, y, c=0.05)
    module = BookKeepingModule(model, max_grad_norm=0.05)
    try:
        clipped_gradient_sum(module, [x], y, loss_fn=ce, micro_batch_size=micro, as_list=False)
    finally:
        module.cleanup()
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert ref[n].abs().max() > 1e-8, n
            torch.testing.assert_close(p.grad, ref[n], rtol=1e-9, atol=1e-12, msg=n)


def test_one_epoch_is_one_noisy_step_over_the_whole_set():
    model = tiny_vit(train=True)
    apply_regime(model, "fc", nlft_scope(model))
    x, y = _data()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    ref = _reference_clipped_sum(model, x, y, c=0.05)
    lr, steps = 0.7, []
    state, rec = train_private_full_batch(model, x, y, loss_fn=ce, epochs=1, micro_batch_size=4, lr=lr, epsilon=8.0,
                                          delta=1e-3, max_grad_norm=0.05, progress=steps.append,
                                          noise_generator=torch.Generator().manual_seed(5))
    assert len(steps) == 1 and steps[0]["batch"] == 11
    coins = torch.Generator().manual_seed(5)  # the same coins, drawn in parameter order
    for n, w0 in before.items():
        noise = torch.normal(0.0, rec["sigma"] * 0.05, size=w0.shape, generator=coins, dtype=w0.dtype)
        torch.testing.assert_close(state[n], w0 - lr * (ref[n] + noise) / 11, rtol=1e-9, atol=1e-12, msg=n)


def _gaussian_delta(eps: float, mu: float) -> float:
    """Exact δ(ε) of a Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018, Thm. 8)."""
    phi = lambda t: 0.5 * math.erfc(-t / math.sqrt(2))  # noqa: E731
    return phi(-eps / mu + mu / 2) - math.exp(eps) * phi(-eps / mu - mu / 2)


def test_accounting_is_opacus_rdp_with_q_one_and_within_target():
    model = tiny_vit(train=True)
    apply_regime(model, "fc", nlft_scope(model))
    x, y = _data(n=20)
    target, delta = 2.0, 1e-3
    _, rec = train_private_full_batch(model, x, y, loss_fn=ce, epochs=7, micro_batch_size=6, lr=0.1, epsilon=target,
                                      delta=delta, max_grad_norm=1.0)
    assert rec["sample_rate"] == 1.0 and rec["steps"] == rec["steps_taken"] == 7 and rec["protocol"] == "full-batch"
    acc = RDPAccountant()  # recomputed from the record alone
    acc.history = [(rec["sigma"], 1.0, rec["steps_taken"])]
    assert rec["epsilon_spent"] == pytest.approx(acc.get_epsilon(delta=delta), rel=1e-12)
    assert rec["epsilon_spent"] <= target
    assert rec["epsilon_spent"] == pytest.approx(rec["epsilon_planned"], rel=1e-12)
    # q = 1: T steps compose to one Gaussian mechanism with μ = √T/σ; its exact δ at the
    # reported ε is within the target (RDP is an upper bound on ε)
    mu = math.sqrt(rec["steps_taken"]) / rec["sigma"]
    assert _gaussian_delta(rec["epsilon_spent"], mu) <= delta
    assert _gaussian_delta(0.5 * rec["epsilon_spent"], mu) > delta  # and not vacuously loose


def test_plan_full_batch_ignores_the_micro_batch_and_refuses_other_modes():
    a = plan_budget(epsilon=3, delta=1e-5, public_size=500, batch_size=16, epochs=50, max_grad_norm=1, full_batch=True)
    b = plan_budget(epsilon=3, delta=1e-5, public_size=500, batch_size=999, epochs=50, max_grad_norm=1, full_batch=True)
    assert a["sigma"] == b["sigma"] and a["steps"] == 50 and a["sample_rate"] == 1.0
    model = tiny_vit(train=True)
    x, y = _data()
    with pytest.raises(ValueError, match="'fast' is not supported"):
        train_private_full_batch(model, x, y, loss_fn=ce, epochs=1, micro_batch_size=4, lr=0.1, epsilon=8.0,
                                 delta=1e-3, max_grad_norm=1.0, mode="fast")
