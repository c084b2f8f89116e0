"""The paired test behind each comparative claim: a bootstrap over seeds and test images.

A claim compares two models, T and F, evaluated on the same test images in each of S seeds.
Per seed s the gap is d_s = acc_T − acc_F = mean over images of (correct_T − correct_F); the
estimate is the mean of d_s over seeds. One bootstrap replicate draws S seeds with replacement,
and within each drawn seed n images with replacement, the same images for T and F (paired);
its gap is the mean over the drawn seeds of their resampled gaps. The 95 % interval is the
2.5 and 97.5 percentiles of B replicates. Both sources of variation a reader expects are in it:
which seeds ran and which test images were drawn.

Where a claim averages several paired comparisons of one seed over the same test images (the
unlearning study's removed-shard counts r and requests, the DP study's regimes), each image's
difference d_i is that average, a value in [−1, 1]; a seed's gap is the mean of its d_i, and the
bootstrap resamples images and seeds as above (`paired_bootstrap_gaps`).

Resampling n images of one seed only changes how many images take each distinct value of d
(+1: T right and F wrong, −1 the reverse, 0; a few more for an average), so a replicate draws
those counts from a multinomial: the same distribution as drawing the images themselves, at
O(B · values) cost instead of O(B n).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPLICATES = 4000
LEVEL = 0.95
RNG_SEED = 0  # fixed: the table's intervals are reproducible


@dataclass(frozen=True)
class PairedGap:
    """A paired gap T − F (fractions, not pts) with its bootstrap interval."""

    estimate: float
    low: float
    high: float
    seeds: int
    images: int  # per seed (the smallest, where they differ)

    def test(self) -> str:
        """The test used, in words."""
        over = f"{self.seeds} seed{'s' if self.seeds > 1 else ''} and {self.images} test images"
        return f"paired bootstrap over {over}, {REPLICATES} replicates, {100 * LEVEL:.0f} % percentile interval"


def seed_counts(correct_t: np.ndarray, correct_f: np.ndarray) -> tuple[int, int, int]:
    """(images, T right & F wrong, T wrong & F right) of one seed's paired correctness vectors."""
    t, f = np.asarray(correct_t, dtype=bool), np.asarray(correct_f, dtype=bool)
    if t.shape != f.shape or t.ndim != 1 or not len(t):
        raise ValueError(f"paired correctness vectors must be 1-D, non-empty and of one length: {t.shape}, {f.shape}")
    return len(t), int((t & ~f).sum()), int((~t & f).sum())


def gap_histogram(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, how many images take each) of one seed's per-image differences T − F.

    Args:
        differences: (images,) each test image's T − F (correctness, or its average over the
            claim's paired comparisons), in [−1, 1].
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or not len(d) or not np.isfinite(d).all() or np.abs(d).max() > 1:
        raise ValueError(f"per-image differences must be a non-empty 1-D array of finite values in [-1, 1]: {d.shape}")
    values, counts = np.unique(d, return_counts=True)
    return values, counts


def bootstrap_histograms(per_seed: list[tuple[np.ndarray, np.ndarray]], replicates: int = REPLICATES,
                         rng_seed: int = RNG_SEED) -> PairedGap:
    """The bootstrap interval of the mean over seeds of T − F, from each seed's histogram of
    per-image differences (`gap_histogram`).

    Args:
        per_seed: each seed's (values, image counts).
        replicates: bootstrap replicates B.
        rng_seed: the generator's seed.
    """
    if not per_seed:
        raise ValueError("paired bootstrap: no seed has both models' per-image records")
    rng = np.random.default_rng(rng_seed)
    n = np.array([int(np.sum(counts)) for _, counts in per_seed])
    gaps = np.array([float(np.dot(values, counts)) / m for (values, counts), m in zip(per_seed, n)])
    picks = rng.integers(0, len(per_seed), size=(replicates, len(per_seed)))  # (B, S) seeds drawn with replacement
    # Each drawn seed resamples its images anew, also a seed drawn twice in one replicate.
    sums = np.zeros(replicates)
    for s, ((values, counts), m) in enumerate(zip(per_seed, n)):
        rows, _ = np.nonzero(picks == s)  # the replicate of each draw of seed s
        draws = rng.multinomial(m, np.asarray(counts) / m, size=len(rows))  # (draws, values)
        np.add.at(sums, rows, draws @ np.asarray(values, dtype=np.float64) / m)
    means = sums / len(per_seed)
    low, high = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return PairedGap(float(gaps.mean()), float(low), float(high), len(per_seed), int(n.min()))


def paired_bootstrap(per_seed: list[tuple[int, int, int]], replicates: int = REPLICATES,
                     rng_seed: int = RNG_SEED) -> PairedGap:
    """The bootstrap interval of the mean over seeds of T − F, from each seed's paired counts.

    Args:
        per_seed: each seed's (images, T-only right, F-only right) (`seed_counts`).
        replicates: bootstrap replicates B.
        rng_seed: the generator's seed.
    """
    hists = [(np.array([1.0, -1.0, 0.0]), np.array([plus, minus, m - plus - minus])) for m, plus, minus in per_seed]
    return bootstrap_histograms(hists, replicates, rng_seed)


def paired_bootstrap_gaps(per_seed: list[np.ndarray], replicates: int = REPLICATES,
                          rng_seed: int = RNG_SEED) -> PairedGap:
    """The bootstrap interval of the mean over seeds of T − F, from each seed's per-image differences.

    Args:
        per_seed: each seed's (images,) differences T − F (`gap_histogram`).
        replicates: bootstrap replicates B.
        rng_seed: the generator's seed.
    """
    return bootstrap_histograms([gap_histogram(d) for d in per_seed], replicates, rng_seed)
