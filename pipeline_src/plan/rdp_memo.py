"""The faster RDP accountant of a study's DP jobs, its σ search kept on disk (`plan/cache.py`).

A DP job plans its noise multiplier σ from public settings only (target ε, δ, the public sampling
rate and the number of steps: `dp.budget.plan_budget`), so the default study's 36 DP-SGD jobs plan
3 distinct σ. The search is ~15 evaluations of the fractional orders' series (0.03-0.5 CPU-s per
job, most at small σ). The first job of each setting stores its σ in the study's plan cache
(`results/<experiment>/prepare/.plan_cache`); the others read it, bit for bit (JSON keeps a float's
repr). The key holds every argument, Opacus' version (the search asks Opacus near a threshold) and
the digests of the two files that compute it, so changed code is a new entry. σ is as public as the
settings it comes from: the released record names it.

Every ε, planned or spent, is still computed in the job (`rdp_accountant.epsilon`, one evaluation),
so a σ read from the cache is checked against its target there (`dp.budget.plan_budget`).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from pipeline_src.plan import rdp_accountant
from pipeline_src.plan.cache import cached, package_version

_CODE = (Path(rdp_accountant.__file__), Path(__file__).parent.parent / "dp" / "budget.py")


class StudyRdp:
    """`plan.rdp_accountant` with its σ search memoized in `cache_dir` (a `dp.budget.FastRdp`).

    Args:
        cache_dir: the study's plan cache; None memoizes nothing.
    """

    epsilon = staticmethod(rdp_accountant.epsilon)

    def __init__(self, cache_dir: str | Path | None) -> None:
        self.cache_dir = cache_dir

    def noise_multiplier(self, *, target_epsilon: float, target_delta: float, sample_rate: float, steps: int,
                         exact: Callable[[float], float] | None = None) -> float:
        """`rdp_accountant.noise_multiplier`, or the σ a job of the study stored for the same arguments."""
        key = {"target_epsilon": target_epsilon, "target_delta": target_delta, "sample_rate": sample_rate,
               "steps": steps, "exact": exact is not None, "opacus": package_version("opacus"),
               "code": [hashlib.sha256(p.read_bytes()).hexdigest() for p in _CODE]}
        return float(cached(self.cache_dir, "noise_multiplier", key,
                            lambda: rdp_accountant.noise_multiplier(target_epsilon=target_epsilon,
                                                                    target_delta=target_delta,
                                                                    sample_rate=sample_rate, steps=steps,
                                                                    exact=exact)))
