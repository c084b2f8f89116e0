"""Exact dense linear assignment solved on a sparse candidate graph, with an optimality certificate.

For an (n, n) similarity S, we want the permutation σ maximising Σ_i S[i, σ(i)] (what
`scipy.optimize.linear_sum_assignment(S, maximize=True)` returns). Dense shortest-augmenting-path
solvers cost O(n³) in the worst case (about 1 s for n = 3072, the FFN width of ViT-B). In FFN
matching the optimal partner of a unit is almost always among its few most similar units (on
random ViT-B weights within its 25 best), so:

1. Candidates E: the k largest entries of every row, plus the diagonal (so that E always holds
   a perfect matching).
2. Solve the assignment on E alone (`scipy.sparse.csgraph.min_weight_full_bipartite_matching`,
   sparse Jonker-Volgenant).
3. Certificate. LP duality: σ is optimal on the *dense* problem iff there are potentials (a, b)
   with a_i + b_j ≥ S[i, j] for every (i, j) and equality on σ. Putting a_i = S[i, σ(i)] − b_σ(i),
   the constraints on E read v_j ≤ v_σ(i) + (S[i, σ(i)] − S[i, j]) for v = −b: shortest-path
   distances in the residual graph (column σ(i) → column j, for each candidate (i, j)), which
   exist because σ is optimal on E (no negative cycle). Bellman-Ford, vectorised over edges.
4. Check a_i + b_j ≥ S[i, j] − tol on all n² entries (on S's device, one float32 pass).
   Entries that violate it join E and we go back to 2; without violations σ is a dense optimum
   (up to n·tol, tol = 1e-11·max|S|, far below the float32 rounding of S itself).

On random ViT-B weights (n = 3072, k = 48) one round suffices and the whole solve takes about
a quarter of scipy's dense time on one CPU core; the n² work (top-k, the check) runs on S's device.

If a round limit is hit, or Bellman-Ford does not settle (a negative cycle from rounding), the
dense solver runs instead, so the result is always an optimum of the dense problem. The optimum
is unique for generic real data, and then this returns exactly scipy's dense answer; on exact
ties (e.g. duplicated units) it may return another, equally good, optimum.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import min_weight_full_bipartite_matching

CANDIDATES = 48  # per-row candidates: one round on random ViT-B weights (32 often needs two)
# Below this size scipy's dense solver is faster. Measured on FFN similarities of random timm ViT
# blocks (hidden = 4 x embed), one thread, process CPU time, medians of 5-7 interleaved runs, this
# 2-core machine under load (benchmarks/bench_matching.py --threshold): dense / sparse time =
# 0.59 (n 256), 0.56 (384), 0.71-0.72 (512), 0.79 (640), 1.13-1.26 (768), 1.60 (1024), 2.10 (1536),
# 2.87 (2048), 4.24 (3072). It was 2048, which sent ViT-S (1536) to the 2x slower dense solver.
DENSE_BELOW = 768
CHECK_CHUNK = 1 << 22  # entries of S checked per step of the certificate (bounds temporary memory)


def dense_assignment(sim: torch.Tensor) -> np.ndarray:
    """cols (n,) with Σ_i sim[i, cols[i]] maximal, by scipy's dense solver (float64)."""
    rows, cols = linear_sum_assignment(sim.detach().double().cpu().numpy(), maximize=True)
    assert (rows == np.arange(len(rows))).all()
    return cols


def candidate_mask(sim: torch.Tensor, k: int) -> torch.Tensor:
    """(n, n) bool: the k largest entries of each row, and the diagonal (a perfect matching)."""
    n = sim.shape[0]
    mask = torch.zeros(n, n, dtype=torch.bool, device=sim.device)
    mask.scatter_(1, sim.topk(min(k, n), dim=1).indices, True)
    mask.diagonal().fill_(True)
    return mask


def _sparse_solve(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int) -> np.ndarray:
    """Max-weight perfect matching on the edges (rows, cols) with weights vals (float64)."""
    # csgraph treats zero weights as missing edges: shift all weights to ≥ 1 (same optimum).
    cost = (vals.max() - vals) + 1.0
    graph = csr_matrix((cost, (rows, cols)), shape=(n, n))
    _, match = min_weight_full_bipartite_matching(graph)
    return match


def dual_potentials(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                    match: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Potentials (a, b), each (n,), with a_i + b_j ≥ S[i, j] on every candidate edge and equality
    on the assignment σ; None if σ is not optimal on the candidates.

    With v = −b and a_i = S[i, σ(i)] + v_σ(i), the constraints are v_j ≤ v_σ(i) + S[i, σ(i)] − S[i, j]:
    v are shortest-path distances from a virtual source joined to every column with weight 0,
    over the edges column σ(i) → column j. Bellman-Ford, vectorised over the edges out of the
    columns that changed in the previous pass; a graph that has not settled after n passes has
    a negative cycle (σ can be improved on E).

    Args:
        rows, cols, vals: (E,) candidate edges and their similarities (float64).
        match: (n,) the assignment σ on the candidates (must use candidate edges).
    """
    n = len(match)
    on_match = cols == match[rows]
    matched_val = np.empty(n)
    matched_val[rows[on_match]] = vals[on_match]  # S[i, σ(i)]
    off = ~on_match
    src, dst = match[rows[off]], cols[off]  # (E',) residual edges column σ(i) → column j
    weight = matched_val[rows[off]] - vals[off]
    v = np.zeros(n)
    changed = np.ones(n, dtype=bool)  # columns whose v dropped in the last pass
    for _ in range(n + 1):
        live = changed[src]  # only edges out of changed columns can lower anything
        cand, heads = v[src[live]] + weight[live], dst[live]
        lower = cand < v[heads]
        if not lower.any():
            break
        new = v.copy()
        np.minimum.at(new, heads[lower], cand[lower])
        changed = new < v
        v = new
    else:
        return None
    return matched_val + v[match], -v


def certificate_violations(sim: torch.Tensor, a: np.ndarray, b: np.ndarray, tol: float,
                           sim_absmax: float) -> torch.Tensor:
    """(m, 2) indices (i, j) with sim[i, j] > a_i + b_j + tol, checked on sim's device.

    A float32 screen, with a margin that covers its rounding, flags the few entries near the
    bound; only those are tested in float64.

    Args:
        sim: (n, n) similarities; a, b: (n,) potentials; tol: allowed excess.
        sim_absmax: max |sim| (bounds the screen's rounding).
    """
    n = sim.shape[0]
    # each float32 rounding (of sim, a, b and the two subtractions) is ≤ 2⁻²⁴ of its operand
    screen = tol - 4 * 2.0**-24 * (sim_absmax + np.abs(a).max() + np.abs(b).max())
    a64 = torch.as_tensor(a, dtype=torch.float64, device=sim.device)
    b64 = torch.as_tensor(b, dtype=torch.float64, device=sim.device)
    a32, b32 = a64.float(), b64.float()
    step = max(1, CHECK_CHUNK // n)
    found = []
    for start in range(0, n, step):
        block = sim[start:start + step]  # (step, n)
        near = ((block.float() - a32[start:start + step, None]) - b32[None, :] > screen).nonzero()
        i, j = near[:, 0] + start, near[:, 1]
        exact = sim[i, j].double() - a64[i] - b64[j] > tol
        found.append(torch.stack([i[exact], j[exact]], dim=1))
    return torch.cat(found)


def sparse_assignment(sim: torch.Tensor, k: int = CANDIDATES, max_rounds: int = 4) -> np.ndarray:
    """cols (n,) with Σ_i sim[i, cols[i]] maximal over all permutations (a dense optimum).

    Args:
        sim: (n, n) similarity matrix, any float dtype, on any device.
        k: candidates kept per row (the k largest entries).
        max_rounds: sparse solves (each adding the entries that broke the certificate) before
            falling back to the dense solver.
    """
    if sim.dim() != 2 or sim.shape[0] != sim.shape[1]:
        raise ValueError(f"sparse_assignment: needs a square matrix, got {tuple(sim.shape)}")
    n = sim.shape[0]
    if n < DENSE_BELOW or 2 * k >= n:
        return dense_assignment(sim)
    sim = sim.detach()
    lo, hi = sim.aminmax()
    sim_absmax = max(float(hi), -float(lo))
    if not np.isfinite(sim_absmax):
        return dense_assignment(sim)  # scipy raises on NaN and handles ±inf
    mask = candidate_mask(sim, k)
    tol = 1e-11 * sim_absmax  # far above the rounding of sums along residual paths
    for _ in range(max_rounds):
        idx = mask.nonzero()  # (E, 2), sorted by row then column
        vals = sim[idx[:, 0], idx[:, 1]].double().cpu().numpy()
        rows, cols = idx[:, 0].cpu().numpy(), idx[:, 1].cpu().numpy()
        match = _sparse_solve(rows, cols, vals, n)
        potentials = dual_potentials(rows, cols, vals, match)
        if potentials is None:
            break
        bad = certificate_violations(sim, *potentials, tol, sim_absmax)
        if len(bad) == 0:
            return match
        mask[bad[:, 0], bad[:, 1]] = True
    return dense_assignment(sim)
