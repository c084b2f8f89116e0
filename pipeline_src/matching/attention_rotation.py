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
matrix (and its V/O analogue). `match_attention_layers` solves all heads of all given layers
(Q/K and V/O) with one batched SVD, and gets the scale of eq. 12 from the same per-part products
X1·X2ᵀ, so the weights are read once to form the products and once to apply a·R and R/a.

The baseline restricts R to permutations (linear assignment on the same matrix), which is
the classic permutation-symmetry matching; rotations contain permutations, so per head the
rotation result is never farther from the anchor. Optionally whole heads are first permuted
(jointly for Q, K, V and O), chosen by linear assignment on the best per-pair match value.

This module knows nothing about timm or LAST: callers pass the four projections as tensors.
Row layout: q, k, v are (H·d, D) with rows ordered (head, d); o is (D, H·d) with columns
ordered (head, d). Q/K and V/O may use different head widths.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from scipy.optimize import linear_sum_assignment

from pipeline_src.matching.scaling import scales_from_products


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


@contextmanager
def _lapack_single_threaded(device: torch.device) -> Iterator[None]:
    """On the CPU, run the enclosed batched LAPACK calls on small (d, d) matrices with one
    intra-op thread: threading each 64x64 SVD costs more than it saves (10x the CPU time with
    2 threads on a busy 2-core machine, from spin-waiting). Restores the previous setting."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def procrustes_rotations(m: torch.Tensor) -> torch.Tensor:
    """Batched orthogonal Procrustes: R = U·Vᵀ maximising tr(Rᵀ·M) for each (d, d) slice of M."""
    low = m.dtype not in (torch.float32, torch.float64)  # no half-precision SVD kernels
    with _lapack_single_threaded(m.device):
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
            with _lapack_single_threaded(pair.device):
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
    return match_attention_layers([anchor], [model], num_heads, rotation=rotation, scaling=scaling,
                                  head_permutation=head_permutation)[0]


@dataclass(frozen=True)
class _Group:
    """One per-head symmetry of one layer (Q/K or V/O) as per-head row blocks (H, d, c):
    R acts on the rows of every block; `up` blocks are multiplied by the scale, `down` divided."""

    up: list[torch.Tensor]
    down: list[torch.Tensor]


def _groups(w: HeadWeights, num_heads: int) -> tuple[_Group, _Group]:
    """(Q/K, V/O) groups of one layer: Q/K up [q, b_q], down [k, b_k]; V/O up [v, b_v], down [oᵀ]."""
    def blocks(*ts: torch.Tensor | None) -> list[torch.Tensor]:
        return [_heads(t, num_heads) for t in ts if t is not None]

    return _Group(blocks(w.q, w.bq), blocks(w.k, w.bk)), _Group(blocks(w.v, w.bv), blocks(w.o.T))


def _cross(anchor: list[torch.Tensor], model: list[torch.Tensor]) -> torch.Tensor:
    """Σ over blocks of X1_h·X2_hᵀ: (H, d, d)."""
    return sum(a @ m.transpose(1, 2) for a, m in zip(anchor, model))


def _sq_norms(blocks: list[torch.Tensor]) -> torch.Tensor:
    """Σ over blocks of ‖X_h‖²: (H,)."""
    return sum(b.square().sum((1, 2)) for b in blocks)


def _solve_batched(solve, mats: list[torch.Tensor]) -> list[torch.Tensor]:
    """Apply a batched per-slice solver to (B_i, d, d) stacks in one call per (shape, dtype, device)."""
    groups: dict = {}
    for i, m in enumerate(mats):
        groups.setdefault((tuple(m.shape[1:]), m.dtype, m.device), []).append(i)
    out: list = [None] * len(mats)
    for idx in groups.values():
        solved = solve(torch.cat([mats[i] for i in idx])).split([mats[i].shape[0] for i in idx])
        for i, r in zip(idx, solved):
            out[i] = r
    return out


def _batched_scales(products: list[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    """Eq. 12 for every (xx, xx1, yy, yy1) tuple of (H,) tensors: one host transfer, one solve."""
    sizes = [p[0].shape[0] for p in products]
    flat = torch.stack([torch.cat([p[i] for p in products]) for i in range(4)]).double().cpu().numpy()  # (4, ΣH)
    scales = torch.as_tensor(scales_from_products(*flat))
    return [s.to(dtype=p[0].dtype, device=p[0].device) for s, p in zip(scales.split(sizes), products)]


def _match_heads(anchor: HeadWeights, model: HeadWeights, num_heads: int, rotation: bool,
                 scaling: bool) -> HeadWeights:
    """The within-head step for every head: rotation (or permutation), then scaling.

    Per head and group (Q/K, V/O), with M_up = Σ X1_up·X2_upᵀ and M_down likewise, R solves
    M = M_up + M_down. Eq. 12 needs ‖R·X2_up‖² = ‖X2_up‖² and ⟨R·X2_up, X1_up⟩ = Σ R ⊙ M_up (and
    the same for `down`), so the rotated weights are never formed before the outputs
    (a·R)·X2_up and (R/a)·X2_down. One batched solve and one host transfer serve both groups.
    """
    pairs = list(zip(_groups(anchor, num_heads), _groups(model, num_heads)))  # [Q/K, V/O]
    m_up = [_cross(ga.up, gm.up) for ga, gm in pairs]  # (H, d, d) each
    m_down = [_cross(ga.down, gm.down) for ga, gm in pairs]
    rots = _solve_batched(procrustes_rotations if rotation else assignment_permutations,
                          [u + d for u, d in zip(m_up, m_down)])  # (H, d, d) each
    if scaling:
        products = [(_sq_norms(gm.up), (r * u).sum((1, 2)), _sq_norms(gm.down), (r * d).sum((1, 2)))
                    for (_, gm), r, u, d in zip(pairs, rots, m_up, m_down)]  # (H,) each
        up_down = [(r * a[:, None, None], r / a[:, None, None]) for r, a in zip(rots, _batched_scales(products))]
    else:
        up_down = [(r, r) for r in rots]
    outs = [([r_up @ x for x in gm.up], [r_down @ x for x in gm.down])
            for (_, gm), (r_up, r_down) in zip(pairs, up_down)]
    (q, *bq), (k, *bk) = outs[0]
    (v, *bv), (o_t,) = outs[1]
    return HeadWeights(q=_unheads(q, bias=False), k=_unheads(k, bias=False), v=_unheads(v, bias=False),
                       o=_unheads(o_t, bias=False).T.contiguous(),
                       bq=_unheads(bq[0], bias=True) if bq else None, bk=_unheads(bk[0], bias=True) if bk else None,
                       bv=_unheads(bv[0], bias=True) if bv else None)


_FIELDS = ("q", "k", "v", "o", "bq", "bk", "bv")


def _stack_layers(layers: list[HeadWeights]) -> HeadWeights:
    """Layers of equal shapes as one layer of L·H heads: rows of q, k, v (and biases), and
    columns of o, concatenated in layer order."""
    def cat(f: str, dim: int = 0) -> torch.Tensor | None:
        ts = [getattr(w, f) for w in layers]
        return None if ts[0] is None else torch.cat(ts, dim=dim)

    return HeadWeights(q=cat("q"), k=cat("k"), v=cat("v"), o=cat("o", dim=1), bq=cat("bq"), bk=cat("bk"), bv=cat("bv"))


def _split_layers(w: HeadWeights, n: int) -> list[HeadWeights]:
    """Inverse of `_stack_layers` for n layers."""
    parts = {f: [None] * n if getattr(w, f) is None else getattr(w, f).chunk(n, dim=1 if f == "o" else 0)
             for f in _FIELDS}
    parts["o"] = [o.contiguous() for o in parts["o"]]
    return [HeadWeights(**{f: parts[f][i] for f in _FIELDS}) for i in range(n)]


def _layout(w: HeadWeights) -> tuple:
    """Shapes, dtypes and devices of the projections (layers stack only if these agree)."""
    tensors = (getattr(w, f) for f in _FIELDS)
    return tuple(None if t is None else (tuple(t.shape), t.dtype, t.device) for t in tensors)


def match_attention_layers(
    anchors: list[HeadWeights],
    models: list[HeadWeights],
    num_heads: int,
    *,
    rotation: bool = True,
    scaling: bool = True,
    head_permutation: bool = False,
) -> list[HeadWeights]:
    """`match_attention_heads` for many layers at once.

    Every head is matched on its own, so layers of one layout are matched as a single layer
    with L·H heads: a few large batched operations (one SVD, one scale solve) instead of many
    small ones per layer, which matters for GPU syncs and for CPU thread-pool overheads.

    Args:
        anchors, models: the layers' projections, pairwise of equal shapes.
        num_heads, rotation, scaling, head_permutation: as in `match_attention_heads`
            (whole heads are permuted within their own layer).

    Returns:
        The transformed projections of each of `models`.
    """
    if len(anchors) != len(models):
        raise ValueError(f"attention_rotation: {len(anchors)} anchor layers but {len(models)} model layers")
    for anchor, model in zip(anchors, models):
        _check(anchor, num_heads, "anchor")
        _check(model, num_heads, "model")
        for f in _FIELDS:
            a, b = getattr(anchor, f), getattr(model, f)
            if (a is None) != (b is None) or (a is not None and a.shape != b.shape):
                raise ValueError(f"attention_rotation: anchor and model differ in '{f}'")
    if head_permutation:
        models = [permute_heads(m, head_assignment(a, m, num_heads, rotation), num_heads)
                  for a, m in zip(anchors, models)]
    n = len(models)
    if n == 1 or len({_layout(w) for w in [*anchors, *models]}) > 1:
        return [_match_heads(a, m, num_heads, rotation, scaling) for a, m in zip(anchors, models)]
    matched = _match_heads(_stack_layers(anchors), _stack_layers(models), n * num_heads, rotation, scaling)
    return _split_layers(matched, n)
