"""The certified sparse linear assignment against scipy's dense solver."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from pipeline_src.matching import sparse_assignment as sa
from pipeline_src.matching.ffn_permutation import ffn_permutation, ffn_similarity


@pytest.fixture(autouse=True)
def small_sparse_sizes(monkeypatch):
    """Exercise the sparse path at test sizes (it hands sizes below DENSE_BELOW to scipy)."""
    monkeypatch.setattr(sa, "DENSE_BELOW", 256)


def dense_cols(sim: torch.Tensor) -> np.ndarray:
    return linear_sum_assignment(sim.double().numpy(), maximize=True)[1]


def ffn_like(n: int, width: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Similarity of two random FFNs' hidden units (hidden n, model width `width`)."""
    gen = torch.Generator().manual_seed(seed)
    parts = [torch.randn(*shape, generator=gen, dtype=dtype) for _ in range(2)
             for shape in ((n, width), (n,), (width, n))]
    return ffn_similarity(*parts)


def count_calls(monkeypatch, name: str) -> list:
    calls, fn = [], getattr(sa, name)
    monkeypatch.setattr(sa, name, lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    return calls


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n,width", [(512, 32), (640, 128)])
def test_equals_dense_on_ffn_similarities(seed, n, width):
    sim = ffn_like(n, width, seed)
    np.testing.assert_array_equal(sa.sparse_assignment(sim), dense_cols(sim))


def objective(sim: torch.Tensor, cols: np.ndarray) -> float:
    return float(sim.double().numpy()[np.arange(len(cols)), cols].sum())


def test_equals_dense_gaussian_and_dtypes():
    sim = torch.randn(600, 600, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    np.testing.assert_array_equal(sa.sparse_assignment(sim), dense_cols(sim))
    half = sim.half()  # coarse values: tied optima exist, any of them will do
    cols = sa.sparse_assignment(half)
    assert sorted(cols.tolist()) == list(range(600))
    assert objective(half, cols) == objective(half, dense_cols(half))


def test_repair_rounds_reach_the_dense_optimum(monkeypatch):
    sim = ffn_like(600, 48, seed=11)
    solves, dense = count_calls(monkeypatch, "_sparse_solve"), count_calls(monkeypatch, "dense_assignment")
    cols = sa.sparse_assignment(sim, k=2, max_rounds=20)  # 2 candidates per row cannot be enough
    assert len(solves) >= 2 and not dense
    np.testing.assert_array_equal(cols, dense_cols(sim))


def test_falls_back_to_dense_when_candidates_are_poor(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    # every row prefers the same few columns: the row top-k barely covers the optimum
    u, v = torch.rand(700, generator=gen, dtype=torch.float64), torch.rand(700, generator=gen, dtype=torch.float64)
    sim = u[:, None] * v[None, :] ** 8 + 1e-3 * torch.rand(700, 700, generator=gen, dtype=torch.float64)
    dense = count_calls(monkeypatch, "dense_assignment")
    cols = sa.sparse_assignment(sim, k=3, max_rounds=1)
    assert dense  # the certificate failed within one round
    np.testing.assert_array_equal(cols, dense_cols(sim))


def test_ties_give_an_optimum():
    gen = torch.Generator().manual_seed(2)
    sim = torch.randint(0, 3, (600, 600), generator=gen).double()  # many equally good assignments
    cols = sa.sparse_assignment(sim)
    assert sorted(cols.tolist()) == list(range(600))
    assert objective(sim, cols) == objective(sim, dense_cols(sim))


def test_certificate_holds_on_all_entries():
    sim = ffn_like(600, 64, seed=4)
    idx = sa.candidate_mask(sim, 48).nonzero()
    rows, cols = idx[:, 0].numpy(), idx[:, 1].numpy()
    vals = sim[idx[:, 0], idx[:, 1]].double().numpy()
    match = sa._sparse_solve(rows, cols, vals, 600)
    a, b = sa.dual_potentials(rows, cols, vals, match)
    s = sim.double().numpy()
    slack = a[:, None] + b[None, :] - s  # (n, n) ≥ 0 everywhere, 0 on the assignment
    scale = np.abs(s).max()
    assert slack.min() >= -1e-9 * scale
    np.testing.assert_allclose(slack[np.arange(600), match], 0.0, atol=1e-9 * scale)
    assert len(sa.certificate_violations(sim, a, b, 1e-11 * scale, scale)) == 0


def test_small_and_invalid_inputs():
    sim = torch.randn(40, 40, generator=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(sa.sparse_assignment(sim), dense_cols(sim))  # below DENSE_BELOW: dense
    with pytest.raises(ValueError, match="square"):
        sa.sparse_assignment(torch.zeros(600, 599))
    bad = torch.randn(600, 600)
    bad[3, 4] = float("nan")
    with pytest.raises(ValueError):
        sa.sparse_assignment(bad)


def test_ffn_permutation_solvers_agree():
    sim = ffn_like(768, 96, seed=9)
    assert torch.equal(ffn_permutation(sim), ffn_permutation(sim, candidates=None))
