"""How a claim row of `reports/claims.py` is decided from its paired per-image records.

A row compares two models T and F with a claim "T − F ≥ threshold". Where both have per-image
records (`store/per_image.py`), the paired bootstrap over seeds and test images
(`reports/paired_bootstrap.py`) gives an estimate and a 95 % interval, and `verdicts.decide` says
`yes` / `no` / `undecided`; without them the point gap (mean over seeds) says yes / no and the
row has no test (`no paired test`, kept out of the tallies).

Rows that average several paired comparisons (the unlearning study's removed-shard counts r, the
DP study's regimes: the "cases") are tested on that average, each image's difference being its
mean over the cases; each case's own estimate and interval go to the row's note.
"""
from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from pipeline_src.reports import verdicts
from pipeline_src.reports.claim_pairs import seed_differences
from pipeline_src.reports.paired_bootstrap import PairedGap, paired_bootstrap, paired_bootstrap_gaps

EPS = 1e-12  # accuracy ties count as ≥ (point gaps only)

# (T, F, model, N) -> per seed (images, T-only right, F-only right): `claim_rows.paired_counts`
PairedCounts = Callable[[str, str, str, int], list[tuple[int, int, int]]]


def pts(d: float) -> str:
    """A gap (fraction) in percentage points, signed."""
    return f"{100 * d:+.1f} pts"


def interval(gap: PairedGap) -> str:
    """'+1.2 pts [+0.3 pts, +2.1 pts]'."""
    return f"{pts(gap.estimate)} [{pts(gap.low)}, {pts(gap.high)}]"


def column_text(gap: PairedGap, threshold: float) -> str:
    """The row's test column: estimate, interval, the test, the threshold."""
    return f"{interval(gap)}; {gap.test()}; threshold {pts(threshold)}"


def point_holds(point: float, threshold: float, strict: bool = False) -> str:
    """yes / no of a point gap against the threshold (ties hold unless `strict`)."""
    return "yes" if (point > threshold + EPS if strict else point >= threshold - EPS) else "no"


def tested_gap(paired: PairedCounts | None, t: str, f: str, model: str, shards: int, point: float,
               threshold: float) -> tuple[str, str]:
    """(holds, test) of the claim "t − f ≥ threshold" from the paired bootstrap over the seeds'
    per-image records; without them, the point estimate's yes / no and no test.

    Args:
        paired: per-seed paired counts (`claim_rows.paired_counts`); None: none recorded.
        t, f: the methods compared.
        model, shards: the models compared (`shard` at N = 1, or `soup` at N).
        point: the mean over seeds of the metrics' accuracy gap (used without per-image records).
        threshold: the claim's threshold on the gap (fraction).
    """
    counts = paired(t, f, model, shards) if paired is not None else []
    if not counts:
        return point_holds(point, threshold), ""
    gap = paired_bootstrap(counts)
    return verdicts.decide(gap.low, gap.high, threshold), column_text(gap, threshold)


def tested_cases(pairs: pd.DataFrame, threshold: float, case_label: str) -> tuple[str, str, str] | None:
    """(holds, test, per-case note) of a claim on the mean over its cases of T − F, from the
    paired per-image records (`claim_pairs`); None without any.

    Args:
        pairs: seed, case, sample_id, d rows (`claim_pairs.drop_pairs` ...).
        threshold: the claim's threshold on the gap (fraction).
        case_label: what a case is, in words ('r', 'regime'); '' for a claim without cases.
    """
    if pairs.empty:
        return None
    gap = paired_bootstrap_gaps(seed_differences(pairs))
    cases = sorted(set(pairs["case"]))
    test = column_text(gap, threshold)
    if len(cases) < 2:
        return verdicts.decide(gap.low, gap.high, threshold), test, ""
    test += f"; each image's gap the mean over {case_label} = {', '.join(map(str, cases))}"
    each = "; ".join(f"{case_label} = {c}: {interval(paired_bootstrap_gaps(seed_differences(pairs[pairs['case'] == c])))}"
                     for c in cases)
    return verdicts.decide(gap.low, gap.high, threshold), test, f"paired per {case_label}: {each}"
