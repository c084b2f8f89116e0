"""Match timm VisionTransformer state dicts to an anchor (rotation, permutation, scaling).

Zhang et al., "Beyond the Permutation Symmetry of Transformers: The Role of Rotation for
Model Fusion", ICML 2025: attention heads are matched by per-head rotations of Q/K and V/O
(plus optional scaling, eq. 12), FFNs by permutations of hidden units. The anchor stays
fixed; every other model is transformed without changing its function, so that an average
of the matched models (see `pipeline_src.fusion`) is taken between aligned parameters.

timm layout: `blocks.{i}.attn.qkv.weight` (3·H·d_h, D), rows ordered (qkv, head, d_h);
`attn.qkv.bias` (3·H·d_h,) may be absent (qkv_bias=False); `attn.proj.weight` (D, H·d_h),
columns ordered (head, d_h); `mlp.fc1` (hidden, D), `mlp.fc2` (D, hidden).
Blocks with parameters these symmetries do not commute with (qk_norm, scale_norm,
attention gates, GLU MLPs, MLP norm) are refused with an error naming the key. A state dict
cannot show a parameter-free norm (a q_norm/k_norm or attention-output norm without affine
weights also breaks the rotation), so pass the module (`model=`) to have its modules checked
by `check_matchable_modules` as well.
"""
from __future__ import annotations

import numbers
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import torch
from torch import nn

from pipeline_src.matching.attention_rotation import HeadWeights, match_attention_layers
from pipeline_src.matching.ffn_permutation import ffn_permutation, ffn_similarity, permute_ffn

_ATTN_KEYS = {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}
_MLP_KEYS = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


def block_indices(sd: dict, prefix: str = "") -> list[int]:
    """Indices i with a `{prefix}blocks.{i}.attn.qkv.weight` entry, sorted."""
    pat = re.compile(rf"^{re.escape(prefix)}blocks\.(\d+)\.attn\.qkv\.weight$")
    return sorted(int(m.group(1)) for k in sd if (m := pat.match(k)))


def _check_supported(sd: dict, base: str, part: str, allowed: set[str]) -> None:
    stem = f"{base}{part}."
    for key in sd:
        if key.startswith(stem) and key[len(stem):] not in allowed:
            raise ValueError(f"match_models: key '{key}' is not supported by {part} matching "
                             f"(only {sorted(allowed)}); its layer breaks the symmetry")


def check_matchable_modules(model: nn.Module, blocks: Iterable[int] | None = None, *, attention: bool = True,
                            ffn: bool = True, prefix: str = "", num_heads: int | None = None) -> None:
    """Refuse blocks whose MODULES break the symmetries matching relies on, parameters or not.

    Per-head rotations and scalings of Q/K (and V/O) preserve the function only when nothing
    acts on q, k or the attention output between the projections: a q_norm/k_norm (qk_norm) or
    an attention-output norm (scale_norm) does, even without affine parameters (LayerNorm
    centres over d_h, so LN(R·q) ≠ R·LN(q); any norm undoes a scaling). FFN permutation needs a
    plain timm ``Mlp`` (no GLU, no hidden norm).

    Args:
        model: module holding `{prefix}blocks` (a timm VisionTransformer, or a wrapper of one).
        blocks: block indices to check; None = all.
        attention: check the attention modules.
        ffn: check the MLPs.
        prefix: key prefix of the VisionTransformer inside `model` (e.g. "backbone.").
        num_heads: the head count matching will assume; refused unless every checked attention
            module has it (a wrong count rotates slices that straddle heads: not a symmetry).
    Raises:
        ValueError: naming the first offending module path and its type (or head count).
    """
    from timm.layers import Attention, Mlp

    try:
        container = model.get_submodule(f"{prefix}blocks")
    except AttributeError:
        raise ValueError(f"match_models: model {type(model).__name__} has no '{prefix}blocks'") from None
    chosen = range(len(container)) if blocks is None else list(blocks)
    for i in chosen:
        path, blk = f"{prefix}blocks.{i}", container[i]
        if attention:
            attn = getattr(blk, "attn", None)
            if type(attn) is not Attention:
                raise ValueError(f"match_models: '{path}.attn' is {type(attn).__name__}, not timm Attention; "
                                 "its rotation symmetry is not known (RoPE, fused projections, ...)")
            for name in ("q_norm", "k_norm", "norm"):
                m = getattr(attn, name)
                if not isinstance(m, nn.Identity):
                    raise ValueError(f"match_models: '{path}.attn.{name}' ({type(m).__name__}) breaks the attention "
                                     "rotation/scaling symmetry, with or without parameters; attention matching "
                                     "unsupported (qk_norm / scale_norm)")
            if num_heads is not None and attn.num_heads != num_heads:
                raise ValueError(f"match_models: '{path}.attn' has {attn.num_heads} heads, but matching was asked "
                                 f"for num_heads={num_heads}; per-head rotations would mix heads")
            if getattr(attn, "gate", None) is not None:
                raise ValueError(f"match_models: '{path}.attn.gate' (gated attention) breaks the V/O rotation symmetry")
        if ffn:
            mlp = getattr(blk, "mlp", None)
            if type(mlp) is not Mlp:
                raise ValueError(f"match_models: '{path}.mlp' is {type(mlp).__name__}, not timm Mlp; "
                                 "FFN permutation unsupported (GLU/SwiGLU MLPs)")
            if not isinstance(mlp.norm, nn.Identity):
                raise ValueError(f"match_models: '{path}.mlp.norm' ({type(mlp.norm).__name__}) is not permuted by "
                                 "FFN matching; FFN matching unsupported")


def _attention(sd: dict, base: str) -> HeadWeights:
    w = sd[f"{base}attn.qkv.weight"]
    b = sd.get(f"{base}attn.qkv.bias")
    q, k, v = w.chunk(3, dim=0)  # each (H·d_h, D)
    bq, bk, bv = (None, None, None) if b is None else b.chunk(3, dim=0)
    return HeadWeights(q=q, k=k, v=v, o=sd[f"{base}attn.proj.weight"], bq=bq, bk=bk, bv=bv)


def _ffn_parts(sd: dict, base: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(fc1 weight, fc1 bias or None, fc2 weight) of one block."""
    return sd[f"{base}mlp.fc1.weight"], sd.get(f"{base}mlp.fc1.bias"), sd[f"{base}mlp.fc2.weight"]


def _permuted_ffn(sim: torch.Tensor, model_sd: dict, base: str) -> dict:
    """Permuted fc1 weight/bias and fc2 weight of one block, keyed by state-dict name.

    Args:
        sim: (hidden, hidden) `ffn_similarity` of the anchor's and the model's units.
        model_sd: the model's state dict; base: the block's key prefix.
    """
    fc1_w, fc1_b, fc2_w = permute_ffn(ffn_permutation(sim), *_ffn_parts(model_sd, base))
    out = {f"{base}mlp.fc1.weight": fc1_w, f"{base}mlp.fc2.weight": fc2_w}
    if fc1_b is not None:
        out[f"{base}mlp.fc1.bias"] = fc1_b
    return out


def check_num_heads(num_heads) -> None:
    """Refuse a head count that is not a positive int (bool, float, str and None included)."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise TypeError(f"match_models: num_heads must be a positive int, got {num_heads!r} "
                        f"({type(num_heads).__name__})")


def match_to_anchor(
    anchor_sd: dict,
    model_sd: dict,
    *,
    num_heads: int,
    blocks: Iterable[int] | None = None,
    attention: bool = True,
    ffn: bool = True,
    scaling: bool = True,
    rotation: bool = True,
    head_permutation: bool = False,
    prefix: str = "",
    workers: int | None = None,
    model: nn.Module | None = None,
    plain_attention: bool = False,
) -> dict:
    """Return `model_sd` transformed (same function) to be close to `anchor_sd`.

    Args:
        anchor_sd: state dict of the fixed anchor model.
        model_sd: state dict to transform; not modified. Entries that matching does not touch
            are shared (same tensor objects) with it.
        num_heads: attention heads per block.
        blocks: block indices to match (e.g. [11] or [8, 9, 10, 11]); None = all blocks.
        attention: match attention heads.
        ffn: match FFN hidden units by linear assignment.
        scaling: after rotation/permutation, scale Q/K and V/O per head (eq. 12).
        rotation: per-head orthogonal rotations if True; per-head permutations (the
            permutation-symmetry baseline) if False.
        head_permutation: also permute whole heads before the within-head step.
        prefix: key prefix of the VisionTransformer inside the state dict (e.g. "backbone.").
        workers: threads solving the per-block FFN assignments (the slowest step, ~0.3 s per
            ViT-B block on one CPU core) while this thread computes the next block's similarity
            and then matches the attention of all blocks; default os.cpu_count().
        model: a module of the architecture both state dicts belong to (keys as in them); its
            modules are checked by `check_matchable_modules` first. Without it only the keys
            are checked, which cannot see a parameter-free q_norm/k_norm or attention norm, so
            it is required unless `plain_attention`.
        plain_attention: the caller vouches that no matched block has a parameter-free norm
            inside its attention (needed without `model`).
    Raises:
        TypeError: `num_heads` is not a positive int. ValueError: neither `model` nor
            `plain_attention`, or an unsupported block.
    """
    check_num_heads(num_heads)
    if model is None and not plain_attention:
        raise ValueError("match_to_anchor: pass the model (`model=`), whose modules are checked for parameter-free "
                         "q/k and attention-output norms that a state dict cannot show (they break the rotation), "
                         "or `plain_attention=True` to vouch that its attention has none")
    all_blocks = block_indices(model_sd, prefix)
    if not all_blocks:
        raise ValueError(f"match_models: no '{prefix}blocks.<i>.attn.qkv.weight' keys in the state dict")
    if block_indices(anchor_sd, prefix) != all_blocks:
        raise ValueError("match_models: anchor and model have different blocks")
    chosen = all_blocks if blocks is None else list(blocks)
    missing = sorted(set(chosen) - set(all_blocks))
    if missing:
        raise ValueError(f"match_models: blocks {missing} not in the model (has {all_blocks})")
    if model is not None:
        check_matchable_modules(model, chosen, attention=attention, ffn=ffn, prefix=prefix, num_heads=num_heads)
    for i in chosen:  # validate everything before any work starts
        base = f"{prefix}blocks.{i}."
        for sd in (anchor_sd, model_sd):
            if attention:
                _check_supported(sd, base, "attn", _ATTN_KEYS)
            if ffn:
                _check_supported(sd, base, "mlp", _MLP_KEYS)
                if sd[f"{base}mlp.fc1.weight"].shape[0] != sd[f"{base}mlp.fc2.weight"].shape[1]:
                    raise ValueError(f"match_models: '{base}mlp.fc1' outputs != fc2 inputs (gated MLP?); "
                                     "FFN matching unsupported")
        if attention and (f"{base}attn.qkv.bias" in anchor_sd) != (f"{base}attn.qkv.bias" in model_sd):
            raise ValueError(f"match_models: '{base}attn.qkv.bias' present in only one model")
    out = dict(model_sd)
    bases = [f"{prefix}blocks.{i}." for i in chosen]
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(chosen)))
    with ThreadPoolExecutor(n_workers) as pool:
        ffn_jobs = []
        for base in bases if ffn else []:
            if len(ffn_jobs) >= 2 * n_workers:  # bound the similarity matrices alive at once
                ffn_jobs[-2 * n_workers].result()
            sim = ffn_similarity(*_ffn_parts(anchor_sd, base), *_ffn_parts(model_sd, base))  # (hidden, hidden)
            ffn_jobs.append(pool.submit(_permuted_ffn, sim, model_sd, base))
        if attention:  # all blocks at once: one batched SVD and one scale solve
            matched = match_attention_layers([_attention(anchor_sd, b) for b in bases],
                                             [_attention(model_sd, b) for b in bases], num_heads,
                                             rotation=rotation, scaling=scaling, head_permutation=head_permutation)
            for base, m in zip(bases, matched):
                out[f"{base}attn.qkv.weight"] = torch.cat([m.q, m.k, m.v], dim=0)
                if m.bq is not None:
                    out[f"{base}attn.qkv.bias"] = torch.cat([m.bq, m.bk, m.bv], dim=0)
                out[f"{base}attn.proj.weight"] = m.o
        for job in ffn_jobs:
            out.update(job.result())
    return out


def match_many(anchor_sd: dict, sds: list[dict], **options) -> list[dict]:
    """Match each of `sds` to `anchor_sd` with `match_to_anchor(**options)`; the anchor itself
    may be among `sds` (it comes back unchanged up to rounding)."""
    return [match_to_anchor(anchor_sd, sd, **options) for sd in sds]


def matched_keys(sd: dict, *, blocks: Iterable[int] | None = None, attention: bool = True,
                 ffn: bool = True, prefix: str = "") -> list[str]:
    """The state-dict keys that `match_to_anchor` with these options may change."""
    chosen = block_indices(sd, prefix) if blocks is None else list(blocks)
    names = (["attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight"] if attention else []) + \
            (["mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight"] if ffn else [])
    return [k for i in chosen for n in names if (k := f"{prefix}blocks.{i}.{n}") in sd]


def parameter_distance(sd1: dict, sd2: dict, keys: Iterable[str] | None = None) -> float:
    """Euclidean distance ‖θ1 − θ2‖₂ over `keys` (default: all floating-point entries of sd1).

    Args:
        sd1, sd2: state dicts with the same shapes on the chosen keys.
        keys: entries to include; a key missing from either dict raises KeyError.
    """
    keys = [k for k, v in sd1.items() if v.is_floating_point()] if keys is None else list(keys)
    total = 0.0
    for k in keys:
        if k not in sd1 or k not in sd2:
            raise KeyError(f"parameter_distance: key '{k}' missing from a state dict")
        total += float(((sd1[k].double() - sd2[k].double().to(sd1[k].device)) ** 2).sum())
    return total ** 0.5
