"""The quartic scale solver (eq. 12) against a dense 1-D search and known scalings."""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from pipeline_src.matching.scaling import optimal_scales


def objective(a: float, x, x1, y, y1) -> float:
    return float(((a * x - x1) ** 2).sum() + ((y / a - y1) ** 2).sum())


def test_matches_bounded_minimisation():
    gen = torch.Generator().manual_seed(0)
    h, n, m = 16, 7, 5
    x, x1 = torch.randn(h, n, generator=gen, dtype=torch.float64), torch.randn(h, n, generator=gen, dtype=torch.float64)
    y, y1 = torch.randn(h, m, generator=gen, dtype=torch.float64), torch.randn(h, m, generator=gen, dtype=torch.float64)
    a = optimal_scales(x, x1, y, y1)
    assert (a > 0).all()
    for i in range(h):
        args = tuple(t[i].numpy() for t in (x, x1, y, y1))
        grid = np.exp(np.linspace(np.log(1e-3), np.log(1e3), 20001))[:, None]  # (G, 1)
        dense = ((grid * args[0] - args[1]) ** 2).sum(1) + ((args[2] / grid - args[3]) ** 2).sum(1)
        g0 = float(grid[np.argmin(dense), 0])
        ref = minimize_scalar(lambda t, args=args: objective(np.exp(t), *args), bracket=(np.log(g0) - 1e-3, np.log(g0) + 1e-3))
        assert objective(float(a[i]), *args) <= objective(float(np.exp(ref.x)), *args) + 1e-9
        assert objective(float(a[i]), *args) <= objective(1.0, *args) + 1e-12


def test_recovers_known_scale_and_degenerate():
    gen = torch.Generator().manual_seed(1)
    x1, y1 = torch.randn(4, 6, generator=gen, dtype=torch.float64), torch.randn(4, 3, generator=gen, dtype=torch.float64)
    s = torch.tensor([0.1, 0.7, 3.0, 25.0], dtype=torch.float64)
    a = optimal_scales(x1 * s[:, None], x1, y1 / s[:, None], y1)
    torch.testing.assert_close(a, 1 / s, rtol=1e-9, atol=0)
    zero = torch.zeros(1, 6, dtype=torch.float64)
    assert float(optimal_scales(zero, x1[:1], y1[:1], y1[:1])) == 1.0
