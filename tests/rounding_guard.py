"""A test-time guard against assertions of accidental bit-equality (issue 44).

A float result is reproducible bit for bit only where the same kernel sees the same operands:
the same shapes, strides (memory layout), dtypes and thread count. Anything else — another batch
size, a channels-last input, another `torch.set_num_threads` — may round differently on another
CPU (AVX2 against AVX-512 GEMM blocking, oneDNN's layout-specific convolutions), even where it
happens to agree on this one.

`ShapeKeyedRounding` makes that difference visible on any machine: under it, every op that
reduces (matmuls, convolutions, sums, norms, softmax, attention, ...) has some of its outputs
moved by one unit in the last place, in a pattern seeded by the op and its operands' shapes,
strides, dtypes and the thread count. Two runs that hand the same kernels the same operands still
agree bit for bit (the guarantee); two that do not, now differ in their last bits, so a
`torch.equal` between them fails here as it would on another CPU. Tolerance comparisons are
unaffected: one ulp per op is the size of the rounding they already allow for.

Used by `tests/conftest.py`: tests (or modules) marked `rounding_guard` run under it, and
`pytest --rounding-guard` runs every collected test under it (an audit of the whole suite).
"""
from __future__ import annotations

import hashlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops whose float results depend on how the kernel orders or blocks its sums (matmul, linear,
# einsum and SDPA's math path decompose into these below autograd, which is where this mode sits).
REDUCING = {
    aten.mm, aten.addmm, aten.addmm_, aten.bmm, aten.baddbmm, aten.baddbmm_, aten.addbmm, aten.addbmm_,
    aten.mv, aten.addmv, aten.addmv_, aten.dot, aten.vdot, aten._int_mm,
    aten.convolution, aten.convolution_backward,
    aten.sum, aten.mean, aten.nansum, aten.prod, aten.cumsum, aten.var, aten.var_mean, aten.std, aten.std_mean,
    aten.linalg_vector_norm, aten.norm, aten._softmax, aten._log_softmax, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.logsumexp,
    aten.native_layer_norm, aten.native_layer_norm_backward, aten.native_group_norm,
    aten.native_group_norm_backward, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
    aten.native_batch_norm_backward,
    aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten.nll_loss_forward, aten.nll_loss_backward,
}


def _operand_key(x) -> str:
    """What decides a kernel's rounding about one operand: shape, strides, dtype (not values)."""
    if isinstance(x, torch.Tensor):
        return f"T{tuple(x.shape)}{x.stride()}{x.dtype}"
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(_operand_key(v) for v in x) + "]"
    return repr(x) if isinstance(x, (int, float, bool, str, type(None))) else type(x).__name__


def _seed(func, args, kwargs) -> int:
    """63 bits from the op, its operands' shapes, strides and dtypes, and torch's thread count."""
    # an optional passed as None is the call that omits it (FlopCounterMode re-dispatches SDPA's
    # backward with `attn_mask=None` spelled out): not another operand
    given = sorted((k, v) for k, v in kwargs.items() if v is not None)
    key = f"{func}|{_operand_key(list(args))}|{_operand_key(given)}|{torch.get_num_threads()}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def perturbed(out: torch.Tensor, seed: int) -> torch.Tensor:
    """`out` with about two thirds of its elements moved one ulp up or down, in a pattern fixed by `seed`.

    Whole numbers (zero included) and non-finite values stay: a sum of whole numbers is exact in
    any order, and tests rightly compare those (counts, zero gradients of unused parameters).

    Args:
        out: a floating tensor an op returned.
        seed: `_seed` of the op and its operands.
    """
    step = torch.randint(-1, 2, out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device)
    keep = (step == 0) | (out == out.trunc()) | ~out.isfinite()
    towards = torch.where(step > 0, float("inf"), float("-inf")).to(out.dtype)
    return torch.where(keep, out, torch.nextafter(out, towards))


class ShapeKeyedRounding(TorchDispatchMode):
    """Moves reducing ops' results by ±1 ulp, keyed by their operands' shapes, strides, dtypes and
    the thread count (module doc). Thread-local, as every dispatch mode: work in other threads or
    processes runs unguarded."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket not in REDUCING:
            return func(*args, **kwargs)
        seed = _seed(func, args, kwargs)
        out = func(*args, **kwargs)
        if "out" in kwargs or func.overloadpacket.__name__.endswith("_"):  # in place: perturb what was written
            target = kwargs.get("out", args[0])
            for i, t in enumerate(target if isinstance(target, (list, tuple)) else [target]):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    t.copy_(perturbed(t, seed + i))
            return out
        if isinstance(out, torch.Tensor):
            return perturbed(out, seed) if out.is_floating_point() else out
        if isinstance(out, (list, tuple)):
            return type(out)(perturbed(t, seed + i) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                             for i, t in enumerate(out))
        return out
