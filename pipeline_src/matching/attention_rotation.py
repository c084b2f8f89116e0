"""Per-head rotation (or permutation) and scaling matching of multi-head attention.

Zhang et al., "Beyond the Permutation Symmetry of Transformers: The Role of Rotation
for Model Fusion", ICML 2025 (Algorithm 1 and eq. 12).

For one head h with query/key rows q_h, k_h ∈ R^{d×D}: replacing (q_h, b_q,h, k_h, b_k,h) by
(R·q_h, R·b_q,h, R·k_h, R·b_k,h) with R orthogonal keeps every score qᵀk, so the function is
unchanged. Likewise for (v_h, b_v,h) and the head's output columns o_h ∈ R^{D×d}: (R·v_h, o_h·Rᵀ).
Writing every such group as one per-head "row stack" X_h (all parameters whose rows R acts on,
side by side, with o_h transposed), matching the model (X2) to the anchor (X1) solves the
orthogonal Procrustes problem

    min_R ‖R·X2_h − X1_h‖_F   →   R = U·Vᵀ  where  X1_h·X2_hᵀ = U·S·Vᵀ,

and X1_h·X2_hᵀ = W_q1·W_q2ᵀ + W_k1·W_k2ᵀ + b_q1·b_q2ᵀ + b_k1·b_k2ᵀ is the seed's Algorithm 1
matrix (and its V/O analogue). All heads are solved at once by one batched SVD.

The baseline restricts R to permutations (linear assignment on the same matrix), which is
the classic permutation-symmetry matching; rotations contain permutations, so per head the
rotation result is never farther from the anchor. Optionally whole heads are first permuted
(jointly for Q, K, V and O), chosen by linear assignment on the best per-pair match value.

This module knows nothing about timm or LAST: callers pass the four projections as tensors.
Row layout: q, k, v are (H·d, D) with rows ordered (head, d); o is (D, H·d) with columns
ordered (head, d). Q/K and V/O may use different head widths.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from scipy.optimize import linear_sum_assignment

from pipeline_src.matching.scaling import optimal_scales


@dataclass(frozen=True)
class HeadWeights:
    """The four projections of one multi-head attention (biases optional, output bias excluded
    because no head symmetry touches it).

    Args:
        q: (H·d_qk, D_in) query projection weight, rows ordered (head, d_qk).
        k: (H·d_qk, D_in) key projection weight.
        v: (H·d_vo, D_in) value projection weight.
        o: (D_out, H·d_vo) output projection weight, columns ordered (head, d_vo).
        bq, bk, bv: (H·d,) biases or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    bq: torch.Tensor | None = None
    bk: torch.Tensor | None = None
    bv: torch.Tensor | None = None


def _check(w: HeadWeights, num_heads: int, name: str) -> None:
    if w.q.shape != w.k.shape:
        raise ValueError(f"attention_rotation: {name} q {tuple(w.q.shape)} and k {tuple(w.k.shape)} differ")
    if w.q.shape[0] % num_heads or w.v.shape[0] % num_heads:
        raise ValueError(f"attention_rotation: {name} rows q={w.q.shape[0]}, v={w.v.shape[0]} "
                         f"not divisible by num_heads={num_heads}")
    if w.o.shape[1] != w.v.shape[0]:
        raise ValueError(f"attention_rotation: {name} o columns {w.o.shape[1]} != v rows {w.v.shape[0]}")
    for b, rows, label in ((w.bq, w.q.shape[0], "bq"), (w.bk, w.k.shape[0], "bk"), (w.bv, w.v.shape[0], "bv")):
        if b is not None and b.shape != (rows,):
            raise ValueError(f"attention_rotation: {name} {label} shape {tuple(b.shape)} != ({rows},)")


def _heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(H·d, C) → (H, d, C); a bias (H·d,) → (H, d, 1)."""
    t = t if t.dim() == 2 else t[:, None]
    return t.reshape(num_heads, t.shape[0] // num_heads, t.shape[1])


def _unheads(t: torch.Tensor, bias: bool) -> torch.Tensor:
    """(H, d, C) → (H·d, C), or (H·d,) for a bias."""
    t = t.reshape(-1, t.shape[-1])
    return t[:, 0] if bias else t


def qk_stack(w: HeadWeights, num_heads: int) -> torch.Tensor:
    """(H, d_qk, 2·D_in [+2]) per-head row stack [q_h, b_q,h, k_h, b_k,h] (biases if present)."""
    parts = [w.q, w.bq, w.k, w.bk]
    return torch.cat([_heads(p, num_heads) for p in parts if p is not None], dim=2)


def vo_stack(w: HeadWeights, num_heads: int) -> torch.Tensor:
    """(H, d_vo, D_in [+1] + D_out) per-head row stack [v_h, b_v,h, o_hᵀ]."""
    parts = [w.v, w.bv, w.o.T]
    return torch.cat([_heads(p, num_heads) for p in parts if p is not None], dim=2)


def _unstack_qk(stack: torch.Tensor, like: HeadWeights) -> dict:
    d_in, out, col = like.q.shape[1], {}, 0
    for name, has in (("q", True), ("bq", like.bq is not None), ("k", True), ("bk", like.bk is not None)):
        if not has:
            continue
        is_bias = name.startswith("b")
        width = 1 if is_bias else d_in
        out[name] = _unheads(stack[:, :, col:col + width], bias=is_bias)
        col += width
    return out


def _unstack_vo(stack: torch.Tensor, like: HeadWeights) -> dict:
    d_in = like.v.shape[1]
    out = {"v": _unheads(stack[:, :, :d_in], bias=False)}
    col = d_in
    if like.bv is not None:
        out["bv"] = _unheads(stack[:, :, col:col + 1], bias=True)
        col += 1
    out["o"] = _unheads(stack[:, :, col:], bias=False).T.contiguous()
    return out


def procrustes_rotations(m: torch.Tensor) -> torch.Tensor:
    """Batched orthogonal Procrustes: R = U·Vᵀ maximising tr(Rᵀ·M) for each (d, d) slice of M."""
    low = m.dtype not in (torch.float32, torch.float64)  # no half-precision SVD kernels
    u, _, vh = torch.linalg.svd(m.float() if low else m)
    return (u @ vh).to(m.dtype)


def assignment_permutations(m: torch.Tensor) -> torch.Tensor:
    """Batched permutation matrices P maximising tr(Pᵀ·M) (linear assignment per slice)."""
    p = torch.zeros_like(m)
    m_np = m.detach().double().cpu().numpy()
    for h in range(m.shape[0]):
        rows, cols = linear_sum_assignment(m_np[h], maximize=True)
        p[h, rows, cols] = 1.0
    return p


def head_assignment(anchor: HeadWeights, model: HeadWeights, num_heads: int, rotation: bool) -> torch.Tensor:
    """Permutation of whole heads: model head perm[i] is matched to anchor head i.

    The value of pairing anchor head i with model head j is the best within-head match value
    for Q/K plus V/O: the nuclear norm of X1_i·X2_jᵀ for rotations, the assignment value for
    permutations (‖R·X2 − X1‖² = ‖X1‖² + ‖X2‖² − 2·value).
    """
    values = 0.0
    for stack in (qk_stack, vo_stack):
        s1, s2 = stack(anchor, num_heads), stack(model, num_heads)
        pair = torch.einsum("ipc,jqc->ijpq", s1, s2)  # (H_anchor, H_model, d, d)
        if rotation:
            values = values + torch.linalg.svdvals(pair).sum(-1)
        else:
            flat = pair.reshape(-1, *pair.shape[2:])
            perms = assignment_permutations(flat)
            values = values + (perms * flat).sum((-1, -2)).reshape(num_heads, num_heads)
    _, cols = linear_sum_assignment(values.detach().double().cpu().numpy(), maximize=True)
    return torch.as_tensor(cols, dtype=torch.long, device=anchor.q.device)


def permute_heads(w: HeadWeights, perm: torch.Tensor, num_heads: int) -> HeadWeights:
    """Reorder whole heads of all four projections: new head i is old head perm[i]."""
    def rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else _unheads(_heads(t, num_heads)[perm], bias=t.dim() == 1)

    o = _unheads(_heads(w.o.T, num_heads)[perm], bias=False).T.contiguous()
    return HeadWeights(q=rows(w.q), k=rows(w.k), v=rows(w.v), o=o, bq=rows(w.bq), bk=rows(w.bk), bv=rows(w.bv))


def match_attention_heads(
    anchor: HeadWeights,
    model: HeadWeights,
    num_heads: int,
    *,
    rotation: bool = True,
    scaling: bool = True,
    head_permutation: bool = False,
) -> HeadWeights:
    """Transform `model`'s attention (function-preserving) to be close to `anchor`'s.

    Args:
        anchor: the fixed model's projections.
        model: the projections to transform; same shapes as `anchor`.
        num_heads: number of heads H.
        rotation: per-head orthogonal Procrustes if True, else per-head permutation
            (linear assignment) as the permutation-symmetry baseline.
        scaling: after rotation, scale Q/K by (a, 1/a) and V/O by (a, 1/a) per head (eq. 12).
        head_permutation: first permute whole heads by linear assignment.

    Returns:
        The transformed projections of `model`.
    """
    _check(anchor, num_heads, "anchor")
    _check(model, num_heads, "model")
    for f in ("q", "k", "v", "o", "bq", "bk", "bv"):
        a, b = getattr(anchor, f), getattr(model, f)
        if (a is None) != (b is None) or (a is not None and a.shape != b.shape):
            raise ValueError(f"attention_rotation: anchor and model differ in '{f}'")
    if head_permutation:
        model = permute_heads(model, head_assignment(anchor, model, num_heads, rotation), num_heads)
    solve = procrustes_rotations if rotation else assignment_permutations
    qk1, qk2 = qk_stack(anchor, num_heads), qk_stack(model, num_heads)
    vo1, vo2 = vo_stack(anchor, num_heads), vo_stack(model, num_heads)
    # M = X1·X2ᵀ per head: (H, d, d); the transformed stack is R·X2.
    qk2 = solve(qk1 @ qk2.transpose(1, 2)) @ qk2
    vo2 = solve(vo1 @ vo2.transpose(1, 2)) @ vo2
    out = replace(model, **_unstack_qk(qk2, model), **_unstack_vo(vo2, model))
    if scaling:
        out = scale_heads(anchor, out, num_heads)
    return out


def scale_heads(anchor: HeadWeights, model: HeadWeights, num_heads: int) -> HeadWeights:
    """Per-head scaling matching: Q rows × a, K rows ÷ a; V rows × c, O columns ÷ c (eq. 12)."""
    def flat(*ts: torch.Tensor | None) -> torch.Tensor:
        return torch.cat([_heads(t, num_heads).flatten(1) for t in ts if t is not None], dim=1)  # (H, n)

    a = optimal_scales(flat(model.q, model.bq), flat(anchor.q, anchor.bq),
                       flat(model.k, model.bk), flat(anchor.k, anchor.bk))
    c = optimal_scales(flat(model.v, model.bv), flat(anchor.v, anchor.bv),
                       flat(model.o.T), flat(anchor.o.T))
    d_qk, d_vo = model.q.shape[0] // num_heads, model.v.shape[0] // num_heads
    a_rows, c_rows = a.repeat_interleave(d_qk), c.repeat_interleave(d_vo)  # (H·d,)

    def mul(t: torch.Tensor | None, s: torch.Tensor) -> torch.Tensor | None:
        return None if t is None else (t * s[:, None] if t.dim() == 2 else t * s)

    return HeadWeights(q=mul(model.q, a_rows), k=mul(model.k, 1 / a_rows), v=mul(model.v, c_rows),
                       o=model.o / c_rows[None, :], bq=mul(model.bq, a_rows), bk=mul(model.bk, 1 / a_rows),
                       bv=mul(model.bv, c_rows))
