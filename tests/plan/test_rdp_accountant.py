"""plan/rdp_accountant.py (torch-free) against Opacus' RDPAccountant and get_noise_multiplier to
1e-9 relative on a grid of (q, σ, steps, δ), and its A_α against a numerical integral."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as opacus_rdp
from opacus.accountants.utils import get_noise_multiplier
from scipy import integrate, stats

from pipeline_src.plan.rdp_accountant import (
    INTEGER_ORDERS,
    LARGEST_SIGMA_TRIED,
    epsilon,
    epsilon_from_rdp,
    noise_multiplier,
    rdp,
)

QS, SIGMAS = [1e-3, 0.02, 0.3, 0.5, 0.9, 1.0], [0.5, 1.0, 4.0, 50.0]
STEPS, DELTAS = [1, 100, 5000], [1e-5, 1e-8]
ORDERS = RDPAccountant.DEFAULT_ALPHAS


def opacus_epsilon(sigma: float, q: float, steps: int, delta: float, alphas=None) -> float:
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(delta=delta, alphas=alphas)


@pytest.mark.filterwarnings("ignore:Optimal order")
def test_rdp_and_epsilon_match_opacus_on_a_grid():
    """Every (q, σ): one step's RDP at each of Opacus' default orders; every (steps, δ) on top: ε.
    (RDP composes linearly in the steps, so steps and δ need no new series.) One step's RDP also
    gets an absolute 1e-12: at q = 1e-3 and α near 1, log A_α ≈ 2e-6 is the log of a sum of O(1)
    terms, where both implementations carry float noise (each ~3e-8 relative off an mpmath integral)."""
    bad = []
    for q, sigma in itertools.product(QS, SIGMAS):
        want = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=ORDERS)
        got = rdp(q, sigma, ORDERS)
        if not np.allclose(got, want, rtol=1e-9, atol=1e-12):
            bad.append((q, sigma, "rdp", float(np.max(np.abs(got / want - 1)))))
        for steps, delta in itertools.product(STEPS, DELTAS):
            eps_want, _ = opacus_rdp.get_privacy_spent(orders=ORDERS, rdp=want * steps, delta=delta)
            eps_got = epsilon_from_rdp(got * steps, ORDERS, delta)
            if not eps_got == pytest.approx(eps_want, rel=1e-9, abs=0):
                bad.append((q, sigma, steps, delta, eps_want, eps_got))
    assert bad == []
    for q, sigma, steps, delta in [(0.02, 1.0, 100, 1e-5), (0.5, 4.0, 5000, 1e-8)]:  # the accountant end to end
        want = opacus_epsilon(sigma, q, steps, delta)
        assert epsilon(sigma=sigma, sample_rate=q, steps=steps, delta=delta) == pytest.approx(want, rel=1e-9)


@pytest.mark.filterwarnings("ignore:Optimal order")
@pytest.mark.parametrize("q", [1 / 9, 0.01])
def test_epsilon_at_the_largest_sigma_and_integer_orders(q):
    """What the parse-time feasibility check computes: ε at σ = 20·2^15, all orders and integer ones."""
    assert LARGEST_SIGMA_TRIED == 655360
    want = opacus_epsilon(LARGEST_SIGMA_TRIED, q, 50, 1e-5)
    assert epsilon(sigma=LARGEST_SIGMA_TRIED, sample_rate=q, steps=50, delta=1e-5) == pytest.approx(want, rel=1e-9)
    want = opacus_epsilon(LARGEST_SIGMA_TRIED, q, 50, 1e-5, alphas=list(INTEGER_ORDERS))
    got = epsilon(sigma=LARGEST_SIGMA_TRIED, sample_rate=q, steps=50, delta=1e-5, orders=INTEGER_ORDERS)
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("eps,delta,q,steps", [(1.0, 1e-5, 64 / 538, 18), (8.0, 1e-5, 0.02, 500),
                                               (3.0, 1e-6, 1.0, 50), (2.0, 1e-5, 0.25, 8)])
def test_noise_multiplier_matches_opacus(eps, delta, q, steps):
    want = get_noise_multiplier(target_epsilon=eps, target_delta=delta, sample_rate=q, steps=steps, accountant="rdp")
    got = noise_multiplier(target_epsilon=eps, target_delta=delta, sample_rate=q, steps=steps)
    assert got == pytest.approx(want, rel=1e-9)
    assert epsilon(sigma=got, sample_rate=q, steps=steps, delta=delta) <= eps


def test_an_unreachable_target_fails_as_opacus():
    with pytest.raises(ValueError, match="too low"):
        get_noise_multiplier(target_epsilon=1e-4, target_delta=1e-5, sample_rate=0.2, steps=100, accountant="rdp")
    with pytest.raises(ValueError, match="too low"):
        noise_multiplier(target_epsilon=1e-4, target_delta=1e-5, sample_rate=0.2, steps=100)


@pytest.mark.parametrize("alpha", [2, 3, 2.5, 7.3])
def test_rdp_step_is_the_renyi_divergence_of_the_mixture(alpha):
    """A_α = E_{z~μ0}[(μ(z)/μ0(z))^α] with μ = (1−q)·N(0,σ²) + q·N(1,σ²), integrated numerically:
    an independent check of both series (integer and fractional α)."""
    q, sigma = 0.1, 1.5
    mu0 = stats.norm(0, sigma).pdf
    mu = lambda z: (1 - q) * mu0(z) + q * stats.norm(1, sigma).pdf(z)  # noqa: E731
    a, _ = integrate.quad(lambda z: mu0(z) * (mu(z) / mu0(z)) ** alpha, -40, 40, limit=200, epsabs=0, epsrel=1e-13)
    assert rdp(q, sigma, [alpha])[0] == pytest.approx(math.log(a) / (alpha - 1), rel=1e-9)


def test_edge_cases():
    assert rdp(0.0, 1.0, [2.5])[0] == 0.0 and rdp(0.3, 0.0, [2.5])[0] == math.inf
    assert rdp(1.0, 2.0, [3.0])[0] == pytest.approx(3.0 / 8.0)  # the Gaussian mechanism: α/(2σ²)
    assert rdp(0.3, 1.0, [math.inf])[0] == math.inf
    assert np.isfinite(epsilon(sigma=1.0, sample_rate=0.01, steps=10, delta=1e-5))


@pytest.mark.filterwarnings("ignore:Optimal order")
@pytest.mark.parametrize("eps,delta,q,steps", [(8.0, 1e-5, 1 / 16, 240), (1.0, 1e-5, 64 / 538, 18),
                                               (2.0, 1e-5, 0.25, 8), (3.0, 1e-6, 1.0, 50)])
def test_with_exact_the_search_returns_opacus_sigma_exactly(eps, delta, q, steps, monkeypatch):
    """With `exact` (Opacus' ε) the σ is Opacus' own, bit for bit, even where the fast ε is off by up
    to the band: a 0.9·EXACT_BAND relative error moved into the fast accountant changes no result, and
    `exact` is asked only for comparisons that close (here: none of most, at most a few)."""
    from pipeline_src.plan import rdp_accountant as ra

    want = get_noise_multiplier(target_epsilon=eps, target_delta=delta, sample_rate=q, steps=steps, accountant="rdp")
    asked = []

    def exact(sigma):
        asked.append(sigma)
        return opacus_epsilon(sigma, q, steps, delta)

    for bias in (0.0, 0.9 * ra.EXACT_BAND, -0.9 * ra.EXACT_BAND):
        fast = ra.epsilon
        monkeypatch.setattr(ra, "epsilon", lambda fast=fast, bias=bias, **kw: fast(**kw) * (1 + bias))
        asked.clear()
        got = noise_multiplier(target_epsilon=eps, target_delta=delta, sample_rate=q, steps=steps, exact=exact)
        monkeypatch.setattr(ra, "epsilon", fast)
        assert got == want, (bias, got, want)
        assert len(asked) <= 2


def test_exact_decides_a_comparison_on_its_threshold():
    """A fast ε that lands on the target itself is not trusted: `exact` decides it (here, says it is
    far below, so the search stops at that σ)."""
    from pipeline_src.plan import rdp_accountant as ra

    target, q, steps, delta = 2.0, 0.25, 8, 1e-5
    sigma_first = 20.0  # the first σ the search tries
    fast = ra.epsilon
    calls = []
    try:
        ra.epsilon = lambda **kw: target  # exactly on the threshold
        got = noise_multiplier(target_epsilon=target, target_delta=delta, sample_rate=q, steps=steps,
                               exact=lambda s: calls.append(s) or target - 0.005)
    finally:
        ra.epsilon = fast
    assert calls == [sigma_first] and got == sigma_first
