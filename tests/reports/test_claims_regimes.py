"""Claims per regime: the measured distance, the paper's rows at it, and seeds' spread."""
from __future__ import annotations

import pytest

from pipeline_src.reports.regimes import FAR, NEAR, regime_of_gap
from tests.reports.test_claims import claims_of, row, write_study

T1 = "TAFT-1 within 1 pt of NLFT-1"


def _seeded(full_by_seed: dict[str, list[float]], soups: dict[str, list[float]] | None = None) -> list[dict]:
    out = [row(m, "shard", 1, v, seed=s) for m, vs in full_by_seed.items() for s, v in enumerate(vs)]
    for m, vs in (soups or {}).items():
        out += [row(m, "soup", 10, v, seed=s) for s, v in enumerate(vs)]
    return out


@pytest.mark.parametrize("gap, regime", [(0.1, NEAR), (2.0, NEAR), (5.5, NEAR), (5.6, FAR), (11.7, FAR), (30, FAR)])
def test_the_regime_is_the_paper_group_of_the_nearer_gap_range(gap, regime):
    assert regime_of_gap(gap) == regime  # near: 0.1-1.1 pts, far: 10-12 pts


def test_a_far_study_quotes_the_papers_far_rows_and_names_where_the_claim_was_made(tmp_path):
    results = write_study(tmp_path, _seeded({"fc": [0.60], "nlft-1": [0.72], "taft-1": [0.64]}))
    claims = claims_of(results, tmp_path / "r")
    t1 = claims[T1]
    assert "FGVC-Aircraft: NLFT-1 69.9, TAFT-1 62.2, FC 58.2 (−7.7 pts)" in t1["paper's rows at this distance"]
    assert "not far" in t1["paper made it for"] and t1["holds"] == "no"
    md = (tmp_path / "r" / "claims.md").read_text()
    assert "Regime (measured distance" in md and "far (NLFT-1 − FC +12.0 pts: nlft-1 − fc)" in md


def test_a_near_study_quotes_the_near_rows(tmp_path):
    results = write_study(tmp_path, _seeded({"fc": [0.80], "nlft-1": [0.805], "taft-1": [0.81]}))
    t1 = claims_of(results, tmp_path / "r")[T1]
    assert t1["paper's rows at this distance"].startswith("Caltech-256, MIT-67, Pets, Dogs, CUB-200: TAFT-1 − NLFT-1")


def test_a_gap_inside_the_seeds_spread_is_within_noise_not_yes_or_no(tmp_path):
    # TAFT-1 − NLFT-1 per seed: -1.5, -0.5, -1.3 pts: mean -1.1 pts, sd 0.53 pts: |-1.1 − (−1)| < sd
    noisy = {"fc": [0.7, 0.7, 0.7], "nlft-1": [0.800, 0.800, 0.800], "taft-1": [0.785, 0.795, 0.787]}
    # TAFT soup − NLFT soup: +10 pts at every seed: far outside its spread (0)
    soups = {"taft-1": [0.8, 0.8, 0.8], "nlft-1": [0.7, 0.7, 0.7]}
    claims = claims_of(write_study(tmp_path, _seeded(noisy, soups)), tmp_path / "r")
    assert claims[T1]["holds"] == "within noise"
    assert "± 0.5 pts, sd over 3 seeds" in claims[T1]["this study's figure"]
    assert claims["TAFT composition (Δw sum) ≥ non-linear soup, N = 10"]["holds"] == "yes"
    # the same gap at a single seed: a plain no
    one = {m: v[:1] for m, v in noisy.items()}
    assert claims_of(write_study(tmp_path / "one", _seeded(one)), tmp_path / "r1")[T1]["holds"] == "no"
