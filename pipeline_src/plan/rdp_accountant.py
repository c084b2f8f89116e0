"""The RDP accountant of the subsampled Gaussian mechanism, and the noise-multiplier search, in
numpy and scipy only (the integer orders numpy only): the parse-time privacy check (`plan/privacy.py`) needs no torch.

Rényi DP (Mironov 2017, "Rényi Differential Privacy") of the Sampled Gaussian Mechanism: Poisson
sampling at rate q, Gaussian noise of standard deviation σ·C on a sum of updates clipped to C
(Mironov, Talwar & Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
§3.3). At order α, one step costs log(A_α)/(α − 1), with

    A_α = E_{z~μ0}[(μ(z)/μ0(z))^α],  μ0 = N(0, σ²), μ = (1 − q)·μ0 + q·N(1, σ²).

For integer α the binomial expansion is exact: A_α = Σ_{i=0..α} C(α,i) q^i (1−q)^{α−i} e^{(i²−i)/(2σ²)}.
For fractional α the paper splits the integral at z0 = σ²·log(1/q − 1) + 1/2 into two series with
erfc factors, summed until their terms fall below e^−30. T steps compose to T times the cost
(RDP composition), and ε at δ follows from Balle et al. 2020 ("Hypothesis testing interpretations
and Rényi differential privacy", Thm. 21):

    ε = min_α  RDP(α) + log((α − 1)/α) − (log δ + log α)/(α − 1).

Written from the paper; its orders, search and stopping rules are those of Opacus' `RDPAccountant`
and `get_noise_multiplier` (Opacus 1.6: opacus/accountants/{rdp.py,utils.py,analysis/rdp.py}),
so that the σ a training job plans with Opacus is the one planned here. tests/plan/
test_rdp_accountant.py checks both against Opacus to 1e-9 relative.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

# Opacus' RDPAccountant.DEFAULT_ALPHAS: 1.1, 1.2, ..., 10.9, then 12, ..., 63.
DEFAULT_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
INTEGER_ORDERS: tuple[float, ...] = tuple(a for a in DEFAULT_ORDERS if float(a).is_integer())
MAX_SIGMA = 1e6  # get_noise_multiplier gives up once σ passes this
SERIES_CUTOFF = -30.0  # the fractional series stops once both terms are below e^-30
_FIRST_CHUNK, _MAX_CHUNK = 32, 4096  # terms of the fractional series per numpy call (× orders): doubling


def _log_erfc(x: np.ndarray) -> np.ndarray:
    """log erfc(x), accurate in the far tail (erfc(x) = 2·Φ(−x√2))."""
    from scipy import special

    return math.log(2) + special.log_ndtr(-x * math.sqrt(2))


def _log_a_integer(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_α for integer orders α ≥ 2 (a vector): the binomial expansion, summed in log space.

    numpy only: a parse whose check is not cached yet (a fresh results folder) then skips
    scipy.special's import, about a quarter of a second.
    """
    n = int(alphas.max())
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])
    a = alphas.astype(np.int64)[:, None]
    i = np.arange(n + 1)[None, :]
    valid = i <= a  # C(α, i) = 0 for i > α: no term
    log_binom = log_factorial[a] - log_factorial[i] - log_factorial[np.where(valid, a - i, 0)]
    terms = log_binom + i * math.log(q) + (a - i) * math.log1p(-q) + (i * i - i) / (2 * sigma ** 2)
    terms = np.where(valid, terms, -np.inf)
    peak = terms.max(axis=1, keepdims=True)  # logsumexp over i, each order shifted by its largest term
    return peak[:, 0] + np.log(np.exp(terms - peak).sum(axis=1))


def _log_a_fractional(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_α for fractional orders (a vector): the two erfc series of Mironov et al. 2019, §3.3.

    Each term i carries the sign of C(α, i) (negative for odd counts of i > α). The positive and
    negative parts of both series are summed separately in log space and subtracted once. Terms
    come in doubling chunks; an order's series ends at its first term i where both series' terms
    are below e^SERIES_CUTOFF (that term included, as Opacus' do-until loop).
    """
    from scipy import special  # lazily: scipy.special costs 0.5 s of a parse that finds the check cached

    z0 = sigma ** 2 * math.log(1 / q - 1) + 0.5
    log_q, log_1q = math.log(q), math.log1p(-q)
    a = alphas[:, None]
    pos = np.full(len(alphas), -np.inf)  # log-sums of the positive and the negative terms so far
    neg = np.full(len(alphas), -np.inf)
    done = np.zeros(len(alphas), dtype=bool)
    start, chunk = 0, _FIRST_CHUNK
    while not done.all():
        i = np.arange(start, start + chunk, dtype=np.float64)[None, :]
        j = a - i
        coef = special.binom(a, i)
        with np.errstate(divide="ignore"):
            log_coef = np.log(np.abs(coef))
        log_s0 = (log_coef + i * log_q + j * log_1q + (i * i - i) / (2 * sigma ** 2)
                  + math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma)))
        log_s1 = (log_coef + j * log_q + i * log_1q + (j * j - j) / (2 * sigma ** 2)
                  + math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma)))
        small = np.maximum(log_s0, log_s1) < SERIES_CUTOFF
        last = np.where(small.any(axis=1), np.argmax(small, axis=1), chunk)  # the first small term, or none yet
        keep = (np.arange(chunk)[None, :] <= last[:, None]) & ~done[:, None]
        for acc, sign in ((pos, coef > 0), (neg, coef < 0)):
            part = np.where(keep & sign, np.logaddexp(log_s0, log_s1), -np.inf)
            acc[:] = np.logaddexp(acc, special.logsumexp(part, axis=1))
        done |= small.any(axis=1)
        start, chunk = start + chunk, min(2 * chunk, _MAX_CHUNK)
    if np.any(neg >= pos):
        raise ValueError(f"RDP series at q={q}, sigma={sigma} lost all precision at orders {alphas[neg >= pos]}")
    with np.errstate(divide="ignore"):  # neg = -inf: nothing to subtract
        return pos + np.log1p(-np.exp(neg - pos))


def rdp(q: float, sigma: float, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of one sampled Gaussian step at each order (inf where no finite bound exists).

    Args:
        q: Poisson sampling rate, in [0, 1].
        sigma: noise multiplier (noise std / clipping bound).
        orders: Rényi orders, each > 1.
    """
    a = np.asarray(orders, dtype=np.float64)
    if q == 0:
        return np.zeros_like(a)
    if sigma == 0:
        return np.full_like(a, np.inf)
    if q == 1.0:  # no subsampling: the Gaussian mechanism itself
        return a / (2 * sigma ** 2)
    out = np.full_like(a, np.inf)  # α = inf stays inf
    whole = np.isfinite(a) & (a == np.floor(a))
    frac = np.isfinite(a) & ~whole
    if whole.any():
        out[whole] = _log_a_integer(q, sigma, a[whole]) / (a[whole] - 1)
    if frac.any():
        out[frac] = _log_a_fractional(q, sigma, a[frac]) / (a[frac] - 1)
    return out


def epsilon_from_rdp(rdp_total: np.ndarray, orders: Sequence[float], delta: float) -> float:
    """ε at δ from the composed RDP at each order (Balle et al. 2020, Thm. 21), the best order's.

    Args:
        rdp_total: RDP of the whole run at each order (steps × one step's, by composition).
        orders: the orders of `rdp_total`.
        delta: target δ.
    """
    a = np.asarray(orders, dtype=np.float64)
    eps = rdp_total - (math.log(delta) + np.log(a)) / (a - 1) + np.log((a - 1) / a)
    if np.isnan(eps).all():
        return math.inf
    return float(eps[np.nanargmin(eps)])


def epsilon(*, sigma: float, sample_rate: float, steps: int, delta: float,
            orders: Sequence[float] = DEFAULT_ORDERS) -> float:
    """ε after `steps` sampled Gaussian steps at (σ, q), for δ.

    Args:
        sigma: noise multiplier.
        sample_rate: Poisson sampling rate q.
        steps: number of steps (composed).
        delta: target δ.
        orders: the Rényi orders to minimise over (Opacus' defaults).
    """
    return epsilon_from_rdp(rdp(sample_rate, sigma, orders) * steps, orders, delta)


# How close (relative) a fast ε may come to a threshold of the search before `noise_multiplier` asks
# its exact accountant: 1000× the largest disagreement with Opacus tests/plan/test_rdp_accountant.py allows.
EXACT_BAND = 1e-6


def noise_multiplier(*, target_epsilon: float, target_delta: float, sample_rate: float, steps: int,
                     epsilon_tolerance: float = 0.01, exact: Callable[[float], float] | None = None) -> float:
    """The σ that planning picks for (ε, δ) in `steps` steps at rate q, as Opacus'
    `get_noise_multiplier(accountant="rdp")`: double σ from 20 until ε(σ) ≤ target, then bisect
    down until the target is missed by at most `epsilon_tolerance`; the upper end is returned.

    Args:
        target_epsilon: ε to reach.
        target_delta: δ.
        sample_rate: Poisson sampling rate q.
        steps: number of steps.
        epsilon_tolerance: how far below the target the returned σ's ε may lie.
        exact: ε(σ) of the reference accountant (a job: Opacus'). Where given, every comparison
            whose fast ε lies within EXACT_BAND (relative) of its threshold is decided by `exact`
            instead, so the σ returned is the reference search's own, bit for bit, as long as the
            two accountants agree to better than EXACT_BAND; the others cost no reference call.
    Raises:
        ValueError: no σ up to MAX_SIGMA reaches the target ("The privacy budget is too low.").
    """
    def eps_at(sigma: float) -> float:
        return epsilon(sigma=sigma, sample_rate=sample_rate, steps=steps, delta=target_delta)

    def near(eps: float, threshold: float) -> bool:  # a comparison the fast ε might decide wrongly
        return exact is not None and not (abs(eps - threshold) > EXACT_BAND * max(1.0, abs(threshold)))

    def decided(sigma: float, eps: float, *thresholds: float) -> float:  # the ε to compare: fast, or exact near a threshold
        return exact(sigma) if any(near(eps, t) for t in thresholds) else eps

    sigma_low, sigma_high, eps_high = 0.0, 10.0, math.inf
    while eps_high > target_epsilon:
        sigma_high = 2 * sigma_high
        eps_high = eps_at(sigma_high)
        # eps_high is compared with the target now and with target - tolerance after the loop
        eps_high = decided(sigma_high, eps_high, target_epsilon, target_epsilon - epsilon_tolerance)
        if sigma_high > MAX_SIGMA:
            raise ValueError("The privacy budget is too low.")
    while target_epsilon - eps_high > epsilon_tolerance:
        sigma = (sigma_low + sigma_high) / 2
        eps = decided(sigma, eps_at(sigma), target_epsilon, target_epsilon - epsilon_tolerance)
        if eps < target_epsilon:
            sigma_high, eps_high = sigma, eps
        else:
            sigma_low = sigma
    return sigma_high


# The largest σ the search above evaluates before giving up: 20·2^15 (the next doubling passes MAX_SIGMA).
LARGEST_SIGMA_TRIED = 20.0 * 2 ** int(math.log2(MAX_SIGMA / 20))
