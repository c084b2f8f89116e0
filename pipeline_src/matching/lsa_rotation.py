"""Rotation matching of LAST's low-rank self-attention (LSA) heads.

The symmetry is that of Zhang et al., "Beyond the Permutation Symmetry of Transformers:
The Role of Rotation for Model Fusion", ICML 2025, applied to the LSA modules of LAST
(Tang et al., "Low-Rank Attention Side-Tuning for Parameter-Efficient Fine-Tuning", 2024):
an LSA module is LN → down-projections A_Q, A_K, A_V to rank r = H·d → H-head attention on
r dims → up-projection B. Per head, the rows of A_Q and A_K rotate jointly (scores kept), and
the rows of A_V rotate with the head's columns of B. Side networks trained from different
random inits on different shards are where matching before averaging pays off.

`match_lsa_projections` works on plain tensors; `match_lsa_state_dict` is a thin adapter
that finds the four `nn.Linear`s by key prefix and names given as arguments.
Layout assumed: A_* weights (H·d, D) with rows ordered (head, d); B weight (D, H·d) with
columns ordered (head, d) — the usual `reshape(B, N, H, d)` split.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline_src.matching.attention_rotation import HeadWeights, match_attention_heads


@dataclass(frozen=True)
class LSAKeyNames:
    """Submodule names of the four projections inside one LSA module's state-dict prefix
    (defaults: those of `pipeline_src.last.side_network.LowRankSelfAttention`)."""

    q: str = "a_q"
    k: str = "a_k"
    v: str = "a_v"
    o: str = "b"


def match_lsa_projections(
    anchor: dict[str, torch.Tensor | None],
    model: dict[str, torch.Tensor | None],
    num_heads: int,
    *,
    rotation: bool = True,
    scaling: bool = True,
    head_permutation: bool = False,
) -> dict[str, torch.Tensor | None]:
    """Match one LSA module's projections to the anchor's, preserving its function.

    Args:
        anchor, model: dicts with 'q', 'k', 'v', 'o' weights (A_Q, A_K, A_V: (H·d, D); B: (D, H·d))
            and optional 'bq', 'bk', 'bv' biases (B's bias is untouched by the symmetry).
        num_heads: number of LSA heads H.
        rotation, scaling, head_permutation: as in `match_attention_heads`.

    Returns:
        dict with the same keys holding the model's transformed tensors.
    """
    fields = ("q", "k", "v", "o", "bq", "bk", "bv")
    for name, d in (("anchor", anchor), ("model", model)):
        unknown = set(d) - set(fields)
        if unknown or not {"q", "k", "v", "o"} <= set(d):
            raise ValueError(f"lsa_rotation: {name} needs keys q, k, v, o (+ optional bq, bk, bv); got {sorted(d)}")
    m = match_attention_heads(HeadWeights(**{f: anchor.get(f) for f in fields}),
                              HeadWeights(**{f: model.get(f) for f in fields}), num_heads,
                              rotation=rotation, scaling=scaling, head_permutation=head_permutation)
    return {f: getattr(m, f) for f in fields if f in model}


def find_lsa_prefixes(sd: dict, names: LSAKeyNames = LSAKeyNames()) -> list[str]:
    """All prefixes p with `p + names.q + '.weight'` in the state dict, sorted."""
    suffix = f"{names.q}.weight"
    return sorted(k[: -len(suffix)] for k in sd if k.endswith(suffix) and (k == suffix or k[-len(suffix) - 1] == "."))


def match_lsa_state_dict(
    anchor_sd: dict,
    model_sd: dict,
    *,
    num_heads: int,
    module_prefixes: list[str] | None = None,
    names: LSAKeyNames = LSAKeyNames(),
    rotation: bool = True,
    scaling: bool = True,
    head_permutation: bool = False,
) -> dict:
    """Match every LSA module of `model_sd` to `anchor_sd`; other entries are shared unchanged.

    Args:
        anchor_sd, model_sd: state dicts of two side networks of the same architecture.
        num_heads: heads per LSA module.
        module_prefixes: prefixes of the LSA modules (e.g. ["blocks.0.1."]); None = every
            prefix found by `find_lsa_prefixes` in `model_sd`.
        names: submodule names of A_Q, A_K, A_V and B under a prefix.
        rotation, scaling, head_permutation: as in `match_attention_heads`.
    """
    prefixes = find_lsa_prefixes(model_sd, names) if module_prefixes is None else list(module_prefixes)
    if not prefixes:
        raise ValueError(f"lsa_rotation: no '<prefix>{names.q}.weight' keys found in the state dict")
    out = dict(model_sd)
    slots = {"q": names.q, "k": names.k, "v": names.v, "o": names.o}
    for p in prefixes:
        per = []
        for sd_name, sd in (("anchor", anchor_sd), ("model", model_sd)):
            d = {}
            for f, mod in slots.items():
                key = f"{p}{mod}.weight"
                if key not in sd:
                    raise KeyError(f"lsa_rotation: {sd_name} state dict lacks '{key}'")
                d[f] = sd[key]
                if f != "o" and f"{p}{mod}.bias" in sd:
                    d[f"b{f}"] = sd[f"{p}{mod}.bias"]
            per.append(d)
        matched = match_lsa_projections(per[0], per[1], num_heads, rotation=rotation, scaling=scaling,
                                        head_permutation=head_permutation)
        for f, t in matched.items():
            out[f"{p}{slots[f.lstrip('b')]}.{'bias' if f.startswith('b') else 'weight'}"] = t
    return out
