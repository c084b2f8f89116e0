"""A claim's verdict from its paired interval and the paper's row at the study's distance.

The study's test *decides* a claim "gap ≥ threshold" when the 95 % interval lies wholly on one
side of the threshold (`holds`: yes above, no below) and leaves it `undecided` when the interval
holds the threshold. The verdict then compares that decision with what the paper's own row at
the study's distance says (`reports/regimes.py`: e.g. TAFT-1 is 7.7 pts below NLFT-1 on the far
Aircraft, so a far study whose TAFT-1 falls more than 1 pt short `agrees` with the paper):
`agrees`, `disagrees`, or `undecided`. Rows that hold whatever the models learn (a retrain-cost
ratio, matching at one shared init with one seed) are `by construction` and kept out of the
tallies; rows the study cannot test are `n/a`. The premise rows (is the backbone worth
fine-tuning at all?) test the testbed, not a paper: `testbed premise`, also kept out.
"""
from __future__ import annotations

AGREES, DISAGREES, UNDECIDED = "agrees", "disagrees", "undecided"
BY_CONSTRUCTION, NOT_TESTED, NA = "by construction", "no paired test", "n/a"
PREMISE = "testbed premise"  # a check of the study's own testbed, no paper's claim (`reports/testbed_claims.py`)
VERDICTS = (AGREES, DISAGREES, UNDECIDED, BY_CONSTRUCTION, NOT_TESTED, NA, PREMISE)
TALLIED = (AGREES, DISAGREES, UNDECIDED)


def decide(low: float, high: float, threshold: float) -> str:
    """`yes` when the interval [low, high] lies above `threshold`, `no` below, else `undecided`.

    Args:
        low: the interval's lower end.
        high: its upper end.
        threshold: the claim holds when the gap is ≥ this.
    """
    if low > high:
        raise ValueError(f"decide: interval [{low}, {high}] is empty")
    if low > threshold:
        return "yes"
    if high < threshold:
        return "no"
    return UNDECIDED


def verdict(holds: str, paper_holds: bool | None) -> str:
    """The verdict of a decided (or undecided) row against the paper's row at that distance.

    Args:
        holds: `yes` / `no` / `undecided` (`decide`).
        paper_holds: whether the claim held on the paper's row at the study's distance; None:
            the paper has no row there, and the claim as the paper states it (it holds) counts.
    """
    if holds == UNDECIDED:
        return UNDECIDED
    if holds not in ("yes", "no"):
        raise ValueError(f"verdict: holds '{holds}' is none of yes, no, undecided")
    expected = True if paper_holds is None else paper_holds
    return AGREES if (holds == "yes") == expected else DISAGREES
