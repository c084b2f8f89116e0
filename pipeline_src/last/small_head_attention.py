"""Attention for the stacked LAST grid: fused SDPA or a chunked `bmm` path, chosen per device.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024 -- LSA modules attend over r/n-dimensional heads
(r = 16, n = 4 gives head_dim 4), so a grid of M networks runs M·B·n small attention matrices.
The `bmm` path follows the recomputation of FlashAttention (Dao et al., NeurIPS 2022): it keeps
only q, k, v and the output for backward and recomputes each chunk's probabilities there, so
the (M·B·n, N, N) matrix never exists whole and each chunk stays in cache.

Which path is faster was measured (`benchmarks/bench_last.py --attention`, fwd + bwd, one thread,
process CPU time, medians of 5; shape (M·B, 4 heads, 65 tokens, head_dim), torch 2.14 CPU):

    head_dim  M·B   SDPA     bmm (chunk 64)   bmm saving P (no recompute)  plain autograd bmm
    4         512   51 ms    60 ms            88 ms                        126 ms
    8         512   66 ms    68 ms            92 ms                        131 ms
    16        512   61 ms    65 ms            75 ms                        132 ms
    4         32    3.4 ms   6.6 ms           4.1 ms                       3.6 ms

In the grid step itself (`bench_last.py --threads 1 --cases last,grid`, 16 networks, D 192, depth 6,
batch 32, r 16, 4 heads; process CPU time, two interleaved runs) SDPA took 1.24-1.31 s and bmm
1.87-1.91 s. So on the CPU SDPA stays: its flash kernel already never materialises the matrix and its cost
per (query, key) entry (~6 ns fwd + bwd) is set by the exponentials, which grow with M. No
CUDA measurement was possible here; `ATTENTION_PATH` holds the choice per device type and
`bench_last.py --attention bmm` measures the other path on a new device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# device type -> "sdpa" | "bmm"; measured as in the module docstring. Unlisted types use "sdpa".
ATTENTION_PATH: dict[str, str] = {"cpu": "sdpa"}
CHUNK = 64  # (batch·head) matrices per bmm chunk: 64 × 65 × 65 floats ≈ 1 MB, in L2 (measured best of 16/64/256)


class _ChunkedAttention(torch.autograd.Function):
    """softmax(q kᵀ · scale) v over (G, N, d) tensors, chunk by chunk, recomputing P in backward."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float, chunk: int) -> Tensor:  # type: ignore[override]
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        for s in range(0, q.shape[0], chunk):
            sl = slice(s, s + chunk)
            p = torch.bmm(q[sl], k[sl].transpose(1, 2)).mul_(scale).softmax(-1)
            torch.bmm(p, v[sl], out=out[sl])
        ctx.save_for_backward(q, k, v, out)
        ctx.scale, ctx.chunk = scale, chunk
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor):  # type: ignore[override]
        q, k, v, out = ctx.saved_tensors
        scale, chunk = ctx.scale, ctx.chunk
        d_out = d_out.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = (d_out * out).sum(-1, keepdim=True)  # rowsum(P ⊙ dP) = rowsum(dO ⊙ O)
        for s in range(0, q.shape[0], chunk):
            sl = slice(s, s + chunk)
            p = torch.bmm(q[sl], k[sl].transpose(1, 2)).mul_(scale).softmax(-1)
            torch.bmm(p.transpose(1, 2), d_out[sl], out=dv[sl])
            ds = torch.bmm(d_out[sl], v[sl].transpose(1, 2)).sub_(delta[sl]).mul_(p).mul_(scale)  # softmax backward
            torch.bmm(ds, k[sl], out=dq[sl])
            torch.bmm(ds.transpose(1, 2), q[sl], out=dk[sl])
        return dq, dk, dv, None, None


def bmm_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, chunk: int = CHUNK) -> Tensor:
    """Non-causal attention like `F.scaled_dot_product_attention(q, k, v, scale=scale)` via chunked bmm.

    Args:
        q, k, v: (..., N, d) with equal leading dims.
        scale: logit scale (1/sqrt(d) for the usual attention).
        chunk: matrices per bmm call.
    """
    lead, n_q = q.shape[:-2], q.shape[-2]
    out = _ChunkedAttention.apply(q.reshape(-1, n_q, q.shape[-1]).contiguous(),
                                  k.reshape(-1, *k.shape[-2:]).contiguous(),
                                  v.reshape(-1, *v.shape[-2:]).contiguous(), scale, chunk)
    return out.view(*lead, n_q, v.shape[-1])


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, path: str | None = None) -> Tensor:
    """Attention by the path measured fastest for q's device (`ATTENTION_PATH`), or by `path`.

    Args:
        q, k, v: (..., N, d).
        scale: logit scale.
        path: "sdpa" or "bmm" to override the table (benchmarks, tests).
    """
    path = path or ATTENTION_PATH.get(q.device.type, "sdpa")
    if path == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    if path == "bmm":
        return bmm_attention(q, k, v, scale)
    raise ValueError(f"LAST attention path {path!r}: expected 'sdpa' or 'bmm'")
