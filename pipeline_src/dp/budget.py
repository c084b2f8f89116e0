"""Privacy budget: noise multiplier from a target (ε, δ) under Poisson sampling, and the
record kept with every DP model.

DP-SGD (Abadi et al. 2016, "Deep learning with differential privacy") with the subsampled
Gaussian mechanism, accounted by Opacus' RDP (Mironov et al. 2019) or PRV
(Gopi et al. 2021, "Numerical composition of differential privacy") accountants.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Protocol

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

ACCOUNTANTS = ("rdp", "prv")
# The neighbouring relation the accountants' ε holds for, recorded with every DP model. Per shard it
# holds because the pipeline's keyed-hash sharding (`plan/sharding.py`) puts one record in one shard.
NEIGHBOURING = "add/remove one sample (keyed-hash sharding: one record changes exactly one shard)"


# How far (relative) a planned ε may lie above its target: the faster accountant's ε agrees with
# Opacus' to 1e-9, and Opacus' search returns a σ whose ε is below the target.
PLANNED_SLACK = 1e-6


class InfeasibleBudget(ValueError):
    """The requested (ε, δ) cannot be met for the planned training."""


def steps_per_epoch(n_samples: int, batch_size: int) -> int:
    """Poisson steps per epoch, as Opacus' DPDataLoader (len of the original loader)."""
    return math.ceil(n_samples / batch_size)


class FastRdp(Protocol):
    """A faster RDP accountant that gives Opacus' answers: `plan.rdp_accountant` (a module fits), which
    the DP steps pass in (this library imports nothing of the pipeline), or a study's memo of it
    (`plan.rdp_memo`). Its ε agrees with Opacus' to 1e-9 relative (tests/plan/test_rdp_accountant.py)."""

    def noise_multiplier(self, *, target_epsilon: float, target_delta: float, sample_rate: float, steps: int,
                         exact: Callable[[float], float] | None = None) -> float:
        """Opacus' `get_noise_multiplier(accountant="rdp")`, with `exact` (Opacus' ε) deciding close comparisons."""

    def epsilon(self, *, sigma: float, sample_rate: float, steps: int, delta: float) -> float:
        """ε after `steps` sampled Gaussian steps at (σ, q)."""


@functools.lru_cache(maxsize=256)  # a pure function of its arguments, and seconds of accounting per call
def _noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str,
                      rdp: FastRdp | None = None) -> float:
    """Opacus' `get_noise_multiplier`. With `rdp` (RDP only) its bisection runs on that accountant,
    and the comparisons that land close to a threshold ask Opacus' own ε: the same σ, bit for bit,
    without most of Opacus' evaluations (pure-Python series, 13 of the 15 per DP job of the default
    study: docs/performance.md)."""
    if accountant == "rdp" and rdp is not None:
        return float(rdp.noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps,
                                          exact=lambda sigma: epsilon_for(sigma=sigma, sample_rate=sample_rate,
                                                                          steps=steps, delta=delta, accountant="rdp")))
    return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                      steps=steps, accountant=accountant))


@functools.lru_cache(maxsize=256)
def epsilon_for(*, sigma: float, sample_rate: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """ε spent by `steps` subsampled Gaussian steps, from Opacus' accountant.

    Args:
        sigma: noise multiplier.
        sample_rate: Poisson sampling rate q.
        steps: number of steps.
        delta: target δ.
        accountant: "rdp" or "prv".
    """
    acc = create_accountant(mechanism=accountant)
    acc.history = [(sigma, sample_rate, steps)]
    return float(acc.get_epsilon(delta=delta))


def spent_epsilon(accountant, delta: float, rdp: FastRdp | None = None) -> float:
    """ε spent so far by an Opacus accountant: from `rdp` where its history is one run of equal steps
    (a constant σ and q, which Opacus' RDP accountant keeps as one entry), else its own.

    Args:
        accountant: an Opacus accountant after training.
        delta: target δ.
        rdp: the faster RDP accountant (`FastRdp`), or None.
    """
    history = getattr(accountant, "history", None)
    if rdp is not None and accountant.mechanism() == "rdp" and history is not None and len(history) == 1:
        sigma, sample_rate, steps = history[0]
        return float(rdp.epsilon(sigma=sigma, sample_rate=sample_rate, steps=steps, delta=delta))
    return float(accountant.get_epsilon(delta=delta))


def plan_budget(*, epsilon: float, delta: float, public_size: int, batch_size: int, epochs: int,
                max_grad_norm: float, accountant: str = "rdp", full_batch: bool = False,
                rdp: FastRdp | None = None) -> dict:
    """Noise multiplier σ reaching (ε, δ) after `epochs` of Poisson-sampled steps, or after
    `epochs` full-batch steps (q = 1, `full_batch.py`).

    Args:
        epsilon: target ε (> 0).
        delta: target δ, in (0, 1/public_size).
        public_size: the dataset size n̄ the plan assumes: a PUBLIC number (declared, not counted),
            because everything planned from it is released with the model. Under add/remove
            neighbours the true size n differs between D and D ± 1, so a plan, a sampling rate or
            a normaliser computed from n would reveal it. The guarantee holds whatever n is.
        batch_size: expected batch size B; the sampling rate is q = 1/ceil(n̄/B), as Opacus
            (full_batch: the micro-batch size, which does not enter the accounting).
        epochs: planned epochs.
        max_grad_norm: clipping bound C (> 0).
        accountant: "rdp" or "prv".
        full_batch: one step per epoch over the whole set: sampling rate 1, steps = epochs.
        rdp: the faster RDP accountant (`FastRdp`) to search σ (the same σ as Opacus') and give the
            planned ε with; None: Opacus'.
    Returns:
        Record with epsilon (target), epsilon_planned (ε of the chosen σ), delta, sigma,
        max_grad_norm, sample_rate, steps, epochs, batch_size, public_size, expected_batch_size
        (q·n̄, the public normaliser of each step; full batch: n̄), accountant.
    Raises:
        InfeasibleBudget: invalid parameters, or no σ ≤ 1e6 reaches ε in the planned steps.
    """
    if accountant not in ACCOUNTANTS:
        raise InfeasibleBudget(f"unknown accountant {accountant!r}; choose one of {ACCOUNTANTS}")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise InfeasibleBudget(f"epsilon must be positive and finite, got {epsilon}")
    if public_size < 1 or batch_size < 1 or epochs < 1:
        raise InfeasibleBudget(f"need public_size, batch_size, epochs ≥ 1; got {public_size}, {batch_size}, {epochs}")
    if not 0 < delta < 1 / public_size:
        raise InfeasibleBudget(f"delta must lie in (0, 1/n̄) = (0, {1 / public_size:.3g}); got {delta}")
    if max_grad_norm <= 0:
        raise InfeasibleBudget(f"max_grad_norm must be positive, got {max_grad_norm}")
    if batch_size > public_size and not full_batch:
        raise InfeasibleBudget(f"sampling rate batch_size/n̄ = {batch_size}/{public_size} > 1")
    spe = 1 if full_batch else steps_per_epoch(public_size, batch_size)
    sample_rate = 1.0 / spe
    steps = spe * epochs
    try:
        sigma = _noise_multiplier(float(epsilon), float(delta), sample_rate, steps, accountant, rdp)
    except ValueError as e:
        raise InfeasibleBudget(f"no noise multiplier reaches epsilon={epsilon}, delta={delta} in {steps} steps "
                               f"at sampling rate {sample_rate:.4g} ({accountant}): {e}") from e
    planned = (rdp.epsilon(sigma=sigma, sample_rate=sample_rate, steps=steps, delta=delta)
               if rdp is not None and accountant == "rdp" else
               epsilon_for(sigma=sigma, sample_rate=sample_rate, steps=steps, delta=delta, accountant=accountant))
    if not planned <= epsilon * (1 + PLANNED_SLACK):  # a σ from a memo (`plan/rdp_memo.py`) is checked here too
        raise RuntimeError(f"the planned σ {sigma} spends ε {planned} > the target {epsilon} in {steps} steps at "
                           f"sampling rate {sample_rate:.4g}, δ {delta} ({accountant})")
    return {
        "epsilon": float(epsilon),
        "epsilon_planned": planned,
        "delta": float(delta),
        "sigma": float(sigma),
        "max_grad_norm": float(max_grad_norm),
        "sample_rate": sample_rate,
        "steps": steps,
        "epochs": epochs,
        "batch_size": batch_size,
        "public_size": public_size,
        "expected_batch_size": public_size * sample_rate,
        "accountant": accountant,
    }
