"""The paired bootstrap against independent references, and the verdicts on constructed rows."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline_src.reports import verdicts
from pipeline_src.reports.paired_bootstrap import gap_histogram, paired_bootstrap, paired_bootstrap_gaps, seed_counts
from pipeline_src.store.per_image import per_image_output, per_image_path, per_image_rows, write_per_image
from tests.reports.test_claims import claims_of, row, write_study

T1 = "TAFT-1 within 1 pt of NLFT-1"
VERDICT, TEST = "verdict vs the paper's row", "paired test: estimate [95 % interval]"


def test_one_seed_interval_matches_the_normal_approximation():
    # n images, T-only right 10 %, F-only right 8 %: gap 0.02; the paired difference's sd is
    # sqrt(p+ + p- − gap²), so the normal interval is gap ± 1.96 sd / sqrt(n)
    n, plus, minus = 5000, 500, 400
    gap = paired_bootstrap([(n, plus, minus)])
    sd = np.sqrt((plus + minus) / n - ((plus - minus) / n) ** 2) / np.sqrt(n)
    half = 1.959964 * sd
    assert gap.estimate == pytest.approx(0.02, abs=1e-15)
    # percentile endpoints of 4,000 replicates: Monte Carlo error a few % of the half width
    assert gap.low == pytest.approx(0.02 - half, abs=0.08 * half)
    assert gap.high == pytest.approx(0.02 + half, abs=0.08 * half)


def test_the_interval_covers_the_true_gap_about_95_percent_of_the_time():
    # three seeds, each with its own true gap around 1 pt (a seed effect), images drawn anew per run
    rng = np.random.default_rng(123)
    true_seed_gaps = np.array([0.005, 0.010, 0.015])  # the population the seeds come from: mean 0.01
    covered, runs = 0, 300
    for run in range(runs):
        counts = []
        for g in rng.choice(true_seed_gaps, size=3):
            d = rng.choice([1, -1, 0], size=2000, p=[0.06 + g / 2, 0.06 - g / 2, 0.88])
            counts.append((len(d), int((d == 1).sum()), int((d == -1).sum())))
        gap = paired_bootstrap(counts, replicates=1000, rng_seed=run)
        covered += gap.low <= true_seed_gaps.mean() <= gap.high
    # a percentile bootstrap over 3 seeds runs a little short of 95 %; far from the one-sd rule's 68 %
    assert 0.85 <= covered / runs <= 0.99, covered / runs


def test_seed_resampling_widens_the_interval_to_the_seeds_spread():
    # no image noise within a seed (every image differs the same way): the spread is the seeds'
    one = paired_bootstrap([(1000, 1000, 0)])
    assert one.low == one.high == 1.0
    two = paired_bootstrap([(1000, 0, 0), (1000, 1000, 0)])  # gaps 0 and 1, no image noise in either
    assert two.estimate == pytest.approx(0.5) and (two.low, two.high) == (0.0, 1.0)  # both seeds drawn twice: 0 or 1


def test_seed_counts_and_bad_input():
    assert seed_counts(np.array([1, 1, 0, 0]), np.array([1, 0, 1, 0])) == (4, 1, 1)
    with pytest.raises(ValueError, match="one length"):
        seed_counts(np.array([1, 0]), np.array([1]))
    with pytest.raises(ValueError, match="no seed"):
        paired_bootstrap([])


@pytest.mark.parametrize("low, high, threshold, holds", [
    (0.01, 0.03, 0.0, "yes"), (-0.03, -0.01, 0.0, "no"), (-0.01, 0.01, 0.0, "undecided"),
    (-0.02, -0.001, -0.01, "undecided"), (-0.009, 0.0, -0.01, "yes"), (-0.05, -0.011, -0.01, "no")])
def test_decide_on_constructed_intervals(low, high, threshold, holds):
    assert verdicts.decide(low, high, threshold) == holds


@pytest.mark.parametrize("holds, paper, expected", [
    ("yes", True, "agrees"), ("no", True, "disagrees"), ("no", False, "agrees"), ("yes", False, "disagrees"),
    ("yes", None, "agrees"), ("undecided", False, "undecided")])
def test_verdict_against_the_papers_row(holds, paper, expected):
    assert verdicts.verdict(holds, paper) == expected


def _exact_bootstrap_quantiles(per_seed: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(atoms, CDF) of the bootstrap distribution of the mean over seeds of the seeds' resampled
    gaps, by enumerating every resample (seeds with replacement, then images with replacement):
    the reference for tiny tables, sharing no code with `paired_bootstrap`."""
    import itertools
    from collections import Counter

    def seed_dist(d):  # every n-tuple of image indices, equally likely
        return Counter(float(np.mean([d[i] for i in idx])) for idx in itertools.product(range(len(d)), repeat=len(d)))

    dists = [seed_dist(d) for d in per_seed]
    s = len(per_seed)
    total = Counter()
    for picks in itertools.product(range(s), repeat=s):  # seeds drawn with replacement
        combos = Counter({0.0: 1.0})
        for k in picks:
            nxt = Counter()
            for a, pa_ in combos.items():
                for b, pb in dists[k].items():
                    nxt[a + b] += pa_ * pb / sum(dists[k].values())
            combos = nxt
        for v, p in combos.items():
            total[round(v / s, 12)] += p / s ** s
    atoms = np.array(sorted(total))
    return atoms, np.cumsum([total[a] for a in atoms])


def test_interval_of_averaged_differences_matches_the_enumerated_bootstrap():
    # a hand-made table: 2 seeds x 4 images, each image's gap the mean over 2 cases (values k/2)
    per_seed = [np.array([1.0, 0.5, 0.0, -0.5]), np.array([0.5, 0.5, 1.0, -1.0])]
    atoms, cdf = _exact_bootstrap_quantiles(per_seed)
    gap = paired_bootstrap_gaps(per_seed, replicates=20000)
    assert gap.estimate == pytest.approx((0.25 + 0.25) / 2, abs=1e-15) and (gap.seeds, gap.images) == (2, 4)
    # the Monte Carlo percentile lands on an atom whose exact CDF brackets the level, to within
    # the replicates' error (sd of a CDF estimate at 20,000 replicates: about 0.001)
    for end, level in ((gap.low, 0.025), (gap.high, 0.975)):
        i = int(np.argmin(np.abs(atoms - end)))
        assert abs(atoms[i] - end) < 1e-9, (end, atoms)  # the percentile of a discrete law is one of its atoms
        below = cdf[i - 1] if i else 0.0
        assert below - 0.005 <= level <= cdf[i] + 0.005, (end, below, cdf[i])


def test_interval_of_averaged_differences_against_literal_image_resampling():
    # one seed of 3,000 images with gaps in {-1, -0.5, 0, 0.5, 1}: a direct bootstrap that draws
    # image indices (another generator) gives the same percentiles up to Monte Carlo error
    rng = np.random.default_rng(7)
    d = rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], size=3000, p=[0.05, 0.1, 0.6, 0.15, 0.1])
    gap = paired_bootstrap_gaps([d])
    direct = np.array([d[rng.integers(0, len(d), len(d))].mean() for _ in range(4000)])
    low, high = np.quantile(direct, [0.025, 0.975])
    half = (high - low) / 2
    assert gap.estimate == pytest.approx(d.mean(), abs=1e-15)
    assert gap.low == pytest.approx(low, abs=0.08 * half) and gap.high == pytest.approx(high, abs=0.08 * half)
    # and the counts form is the special case of values +1 / -1 / 0
    c = np.array([1.0] * 30 + [-1.0] * 20 + [0.0] * 50)
    assert paired_bootstrap_gaps([c], rng_seed=3) == paired_bootstrap([(100, 30, 20)], rng_seed=3)


def test_gap_histogram_and_bad_differences():
    values, counts = gap_histogram(np.array([0.5, -1.0, 0.5, 0.0]))
    assert values.tolist() == [-1.0, 0.0, 0.5] and counts.tolist() == [1, 1, 2]
    for bad in (np.array([]), np.array([1.5]), np.array([np.nan]), np.zeros((2, 2))):
        with pytest.raises(ValueError, match="per-image differences"):
            gap_histogram(bad)


def test_per_image_output_is_the_declared_one_else_beside_the_metrics():
    from pipeline_src.runner.step_args import Paths

    declared = Paths(["m.parquet", "p.parquet"], {"metrics": "r/metrics/x/m.parquet", "per_image": "r/per_image/x/m.parquet"})
    assert per_image_output(declared) == Path("r/per_image/x/m.parquet")
    assert per_image_output(Paths(["m"], {"metrics": "r/metrics/x/m.parquet"})) == Path("r/per_image/x/m.parquet")


def test_per_image_path_and_rows(tmp_path):
    assert per_image_path("r/x/metrics/evaluate/m/n1_s0/soup.parquet") == Path("r/x/per_image/evaluate/m/n1_s0/soup.parquet")
    assert per_image_path("r/x/soup.parquet") == Path("r/x/soup.per_image.parquet")  # a step run on its own
    rows = per_image_rows(torch.tensor([[2.0, 1.0], [0.0, 1.0]]), torch.tensor([0, 0]), ["a", "b"], {"method": "m"})
    assert [(r["sample_id"], r["predicted"], r["correct"]) for r in rows] == [("a", 0, True), ("b", 1, False)]


def _per_image(results: Path, method: str, model: str, shards: int, seed: int, correct: np.ndarray) -> None:
    """A per-image file of one model, as `steps/evaluate.py` writes it."""
    context = {"experiment": "fake", "method": method, "kind": method.split("-")[0], "model": model,
               "shards": shards, "shard_id": 0 if model == "shard" else None, "seed": seed, "split": "test"}
    logits = torch.tensor(np.stack([correct, ~correct], 1).astype(np.float32))  # (images, 2): right when label 0
    rows = per_image_rows(logits, torch.zeros(len(correct), dtype=torch.long),
                          [f"img{i:05d}" for i in range(len(correct))], context)
    write_per_image(rows, per_image_path(results / "metrics" / "evaluate" / method / f"n{shards}_s{seed}" / f"{model}.parquet"))


def _study(tmp_path: Path, full: dict[str, tuple[float, float]], images: int = 2000) -> Path:
    """One seed; per method (accuracy, fraction of images right where T is wrong ...): the
    methods' correctness vectors built to the given accuracies, T and F right on the same
    images up to the gap."""
    results = write_study(tmp_path, [row(m, "shard", 1, acc) for m, (acc, _) in full.items()])
    rng = np.random.default_rng(0)
    order = rng.permutation(images)
    for m, (acc, _) in full.items():
        correct = np.zeros(images, dtype=bool)
        correct[order[: round(acc * images)]] = True  # nested: the better model right wherever the other is
        _per_image(results, m, "shard", 1, 0, correct)
    return results


def test_claims_decide_table1_from_the_paired_test(tmp_path):
    # far study (NLFT-1 − FC 12 pts) where TAFT-1 is 6 pts below NLFT-1: no, and the paper's far row
    # (Aircraft −7.7) says no too: agrees
    far = _study(tmp_path / "far", {"fc": (0.60, 0), "nlft-1": (0.72, 0), "taft-1": (0.66, 0)})
    t1 = claims_of(far, tmp_path / "rf")[T1]
    assert (t1["holds"], t1[VERDICT]) == ("no", "agrees"), t1
    assert "paired bootstrap over 1 seed and 2000 test images" in t1[TEST] and t1[TEST].startswith("-6.0 pts [")
    # near study, TAFT-1 0.95 pts below: the interval (±0.4 pts) holds −1 pt: undecided
    near = _study(tmp_path / "near", {"fc": (0.80, 0), "nlft-1": (0.805, 0), "taft-1": (0.7955, 0)})
    t1 = claims_of(near, tmp_path / "rn")[T1]
    assert (t1["holds"], t1[VERDICT]) == ("undecided", "undecided"), t1
    # near, TAFT-1 above NLFT-1: yes, agrees with the near rows
    above = _study(tmp_path / "above", {"fc": (0.80, 0), "nlft-1": (0.805, 0), "taft-1": (0.81, 0)})
    t1 = claims_of(above, tmp_path / "ra")[T1]
    assert (t1["holds"], t1[VERDICT]) == ("yes", "agrees"), t1
    md = (tmp_path / "ra" / "claims.md").read_text()
    assert "agrees 1, disagrees 0, undecided 0" in md


def test_retrain_cost_rows_are_by_construction_and_left_out_of_the_tally(tmp_path):
    from tests.reports.test_claims import retrain_rows

    results = write_study(tmp_path, retrain_rows("taft-1", 10, [(0.001, 1, 1.0)], paragon_s=8.0))
    claims = claims_of(results, tmp_path / "r")
    cost = claims["Unlearning cost: retrain-shard ≈ N× cheaper than the paragon: taft-1, N = 10"]
    assert (cost["holds"], cost[VERDICT]) == ("yes", "by construction")
    assert "agrees 0, disagrees 0, undecided 0. Not in the tally: testbed premise 0, by construction 1" in (tmp_path / "r" / "claims.md").read_text()
