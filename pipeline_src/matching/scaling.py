"""Scaling matching: the optimal per-head factor a in (a·X, Y/a) after rotation.

Zhang et al., "Beyond the Permutation Symmetry of Transformers: The Role of Rotation
for Model Fusion", ICML 2025, eq. 12. Within a head, Q and K can be scaled by a and 1/a
(QKᵀ unchanged), and likewise V and the head's output columns. Given the anchor's
(X1, Y1) and the model's (X, Y), we minimise

    f(a) = ‖a·X − X1‖² + ‖Y/a − Y1‖²,  a > 0.

f'(a) = 0, multiplied by a³/2, gives the quartic

    ‖X‖²·a⁴ − ⟨X, X1⟩·a³ + ⟨Y, Y1⟩·a − ‖Y‖² = 0.

Its value at a → 0⁺ is −‖Y‖² < 0 and it grows to +∞, so a positive real root always exists
when X and Y are non-zero; f → ∞ at both ends of (0, ∞), so the minimiser is the positive
real root with the smallest f.
"""
from __future__ import annotations

import numpy as np
import torch


def _objective(a: np.ndarray, xx: np.ndarray, xx1: np.ndarray, yy: np.ndarray, yy1: np.ndarray) -> np.ndarray:
    """f(a) up to the constant ‖X1‖² + ‖Y1‖², broadcast over heads and candidate roots."""
    return a**2 * xx - 2 * a * xx1 + yy / a**2 - 2 * yy1 / a


def optimal_scales(x: torch.Tensor, x1: torch.Tensor, y: torch.Tensor, y1: torch.Tensor) -> torch.Tensor:
    """Per-head factors a minimising ‖a·X − X1‖² + ‖Y/a − Y1‖² over a > 0.

    Args:
        x: (H, n) the model's parameters that get multiplied by a (one row per head, flattened).
        x1: (H, n) the anchor's counterpart of `x`.
        y: (H, m) the model's parameters that get divided by a.
        y1: (H, m) the anchor's counterpart of `y`.

    Returns:
        (H,) tensor of factors, dtype and device of `x`. Heads where X or Y is all zero get 1.
    """
    if x.shape != x1.shape or y.shape != y1.shape or x.shape[0] != y.shape[0]:
        raise ValueError(f"scaling: shape mismatch x{tuple(x.shape)} x1{tuple(x1.shape)} "
                         f"y{tuple(y.shape)} y1{tuple(y1.shape)}")
    products = torch.stack([(x * x).sum(1), (x * x1).sum(1), (y * y).sum(1), (y * y1).sum(1)])  # (4, H)
    best = scales_from_products(*products.double().cpu().numpy())
    return torch.as_tensor(best, dtype=x.dtype, device=x.device)


def scales_from_products(xx: np.ndarray, xx1: np.ndarray, yy: np.ndarray, yy1: np.ndarray) -> np.ndarray:
    """The minimiser a > 0 of eq. 12 from its four inner products, for a batch of heads.

    Args:
        xx, xx1, yy, yy1: (H,) float64 ‖X‖², ⟨X, X1⟩, ‖Y‖², ⟨Y, Y1⟩ per head.

    Returns:
        (H,) float64 factors; 1 where X or Y is all zero.
    """
    num_heads = xx.shape[0]
    degenerate = (xx <= 0) | (yy <= 0)
    c4 = np.where(degenerate, 1.0, xx)
    # Monic quartic a⁴ + p3·a³ + 0·a² + p1·a + p0; batched roots = eigenvalues of companion matrices.
    p3, p1, p0 = -xx1 / c4, yy1 / c4, -yy / c4
    comp = np.zeros((num_heads, 4, 4))  # (H, 4, 4)
    comp[:, 1, 0] = comp[:, 2, 1] = comp[:, 3, 2] = 1.0
    comp[:, 0, 0], comp[:, 0, 1], comp[:, 0, 2], comp[:, 0, 3] = -p3, 0.0, -p1, -p0
    roots = np.linalg.eigvals(comp)  # (H, 4) complex
    # A root is real when its imaginary part is tiny relative to its size; the positive real
    # root guaranteed above is always a candidate (fall back to the least-imaginary one).
    tol = 1e-7 * np.maximum(1.0, np.abs(roots))
    real_pos = (np.abs(roots.imag) <= tol) & (roots.real > 0)
    none_ok = ~real_pos.any(1)
    if none_ok.any():
        imag = np.where(roots.real > 0, np.abs(roots.imag), np.inf)
        real_pos[none_ok, imag[none_ok].argmin(1)] = True
    cand = np.where(real_pos, roots.real, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        vals = _objective(cand, xx[:, None], xx1[:, None], yy[:, None], yy1[:, None])
    vals = np.where(np.isnan(vals), np.inf, vals)
    best = cand[np.arange(num_heads), vals.argmin(1)]
    return np.where(degenerate | ~np.isfinite(best), 1.0, best)
