"""Budget planning: σ from a target (ε, δ), recorded ε equals Opacus' accountants, and
infeasible budgets fail before any training."""
from __future__ import annotations

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from pipeline_src.dp import InfeasibleBudget, apply_regime, nlft_scope, plan_budget, train_private
from tests.conftest import tiny_vit


@pytest.mark.parametrize("accountant_name,accountant_cls", [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_recorded_epsilon_equals_opacus_accountant(accountant_name, accountant_cls):
    rec = plan_budget(epsilon=2.0, delta=1e-4, public_size=1000, batch_size=50, epochs=3, max_grad_norm=1.0,
                      accountant=accountant_name)
    assert rec["sample_rate"] == pytest.approx(50 / 1000) and rec["steps"] == 60
    acc = accountant_cls()
    for _ in range(rec["steps"]):
        acc.step(noise_multiplier=rec["sigma"], sample_rate=rec["sample_rate"])
    eps = acc.get_epsilon(delta=1e-4)
    assert rec["epsilon_planned"] == pytest.approx(eps, rel=1e-6)
    assert eps <= 2.0 and eps > 2.0 - 0.05  # binary search tolerance 0.01 in ε (PRV adds its own error)
    # a smaller σ must overshoot the target: the planned σ is not needlessly large
    acc.history = [(rec["sigma"] * 0.97, rec["sample_rate"], rec["steps"])]
    assert acc.get_epsilon(delta=1e-4) > 2.0 - 0.02


@pytest.mark.parametrize("kwargs,match", [
    (dict(epsilon=0.01), "no noise multiplier"),
    (dict(epsilon=0.0), "positive"),
    (dict(epsilon=-1.0), "positive"),
    (dict(delta=0.02), r"delta must lie in \(0, 1/n̄\)"),
    (dict(delta=0.0), "delta"),
    (dict(batch_size=200), "sampling rate"),
    (dict(max_grad_norm=0.0), "max_grad_norm"),
    (dict(accountant="gdpx"), "unknown accountant"),
])
def test_infeasible_budget_fails_before_training(kwargs, match):
    model = tiny_vit(train=True)
    apply_regime(model, "fc", nlft_scope(model))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    calls = []
    args = dict(epochs=1, batch_size=10, lr=0.1, epsilon=1.0, delta=1e-3, max_grad_norm=1.0)
    args.update(kwargs)
    x = torch.randn(100, 1, 16, 16, dtype=torch.float64)
    y = torch.randint(0, 5, (100,))
    with pytest.raises(InfeasibleBudget, match=match):
        train_private(model, x, y, progress=calls.append, **args)
    assert not calls
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert not any(hasattr(p, "_forward_counter") for p in model.parameters())  # Opacus never attached


# The default study's Poisson DP jobs (q = 1/16, 16 steps x 15 epochs) and other shapes; ε 8 needs σ < 1,
# where each of Opacus' RDP evaluations sums the longest series.
@pytest.mark.filterwarnings("ignore:Optimal order")
@pytest.mark.parametrize("epsilon,delta,public_size,batch_size,epochs", [
    (8.0, 1e-5, 500, 32, 15), (1.0, 1e-5, 500, 32, 15), (2.0, 1e-4, 1000, 50, 3)])
def test_the_faster_rdp_search_plans_opacus_own_budget_bit_for_bit(epsilon, delta, public_size, batch_size, epochs):
    """plan_budget with `rdp_accountant` (what the DP steps pass) records the same σ as with Opacus'
    get_noise_multiplier: equal floats, not close ones (the search decides every close comparison with
    Opacus' own ε); the planned ε, from the faster accountant, within 1e-9 of Opacus'."""
    from pipeline_src.dp import budget
    from pipeline_src.plan import rdp_accountant

    kw = dict(epsilon=epsilon, delta=delta, public_size=public_size, batch_size=batch_size, epochs=epochs,
              max_grad_norm=1.0, accountant="rdp")
    budget._noise_multiplier.cache_clear()
    want = plan_budget(**kw)
    budget._noise_multiplier.cache_clear()
    got = plan_budget(**kw, rdp=rdp_accountant)
    assert got["sigma"] == want["sigma"]
    assert got["epsilon_planned"] == pytest.approx(want["epsilon_planned"], rel=1e-9)
    assert {k: v for k, v in got.items() if k != "epsilon_planned"} == {
        k: v for k, v in want.items() if k != "epsilon_planned"}
