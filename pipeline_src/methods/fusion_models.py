"""Tuned models in the fusion study: matching a trained state to an anchor, re-initializing the
tuned blocks per shard, and a module view for fusion statistics.

Matching is that of Zhang et al., "Beyond the Permutation Symmetry of Transformers: The Role
of Rotation for Model Fusion", ICML 2025 (`pipeline_src.matching`); fusion is in
`pipeline_src.fusion`. Trained states are `trainable_state()` dicts: for `nlft`
(`TailFineTune`) timm parameter names (`blocks.3.attn.qkv.weight`, `norm.weight`,
`head.weight`); for `last` (`SideTuned`) side-network names (`blocks.0.0.a_q.weight`, ...).
"""
from __future__ import annotations

import torch
from timm.layers import LayerScale
from torch import nn

from pipeline_src.data.feature_cache import CachedRows, FeatureCache
from pipeline_src.data.sample_store import SampleStore, StoredImages
from pipeline_src.job.glibc_malloc import release_freed
from pipeline_src.matching import block_indices, match_lsa_state_dict, match_to_anchor, matched_keys
from pipeline_src.matching.lsa_rotation import find_lsa_prefixes
from pipeline_src.methods.nonlinear import TailFineTune
from pipeline_src.vit.parts import FromPrefix

# matching kind → (rotation, scaling) of `match_attention_heads`; `none` does not match.
MATCH_OPTIONS = {"permutation": (False, False), "rotation": (True, False), "rotation-scaling": (True, True)}


def _lsa_blocks(prefixes: list[str]) -> list[int]:
    return sorted({int(p.split(".")[1]) for p in prefixes})  # 'blocks.{i}.{t}.' → i


def chosen_blocks(state: dict, kind: str, positions: list[int] | None) -> list[int]:
    """Block indices to match: `positions` (Python-style, -1 = last) among the matchable blocks
    (nlft: the tuned timm blocks; last: the side network's blocks); all when None."""
    blocks = block_indices(state) if kind == "nlft" else _lsa_blocks(find_lsa_prefixes(state))
    if not blocks:
        raise ValueError(f"fusion: no matchable blocks in the {kind} state (keys {sorted(state)[:3]}...)")
    if positions is None:
        return blocks
    bad = [p for p in positions if not -len(blocks) <= p < len(blocks)]
    if bad:
        raise ValueError(f"config key 'fusion.blocks': positions {bad} out of range for {len(blocks)} matchable blocks")
    return sorted({blocks[p] for p in positions})


def _lsa_prefixes(state: dict, blocks: list[int]) -> list[str]:
    return [p for p in find_lsa_prefixes(state) if int(p.split(".")[1]) in blocks]


def matchable_keys(state: dict, kind: str, blocks: list[int], ffn: bool) -> list[str]:
    """The entries a matching of these blocks may change (the same set for every matching kind)."""
    if kind == "nlft":
        return matched_keys(state, blocks=blocks, attention=True, ffn=ffn)
    names = ("a_q.weight", "a_q.bias", "a_k.weight", "a_k.bias", "a_v.weight", "a_v.bias", "b.weight")
    return [k for p in _lsa_prefixes(state, blocks) for n in names if (k := p + n) in state]


def match_state(anchor: dict, state: dict, *, matching: str, kind: str, num_heads: int,
                blocks: list[int], ffn: bool, model: nn.Module | None = None, head_permutation: bool = False) -> dict:
    """`state` transformed to be close to `anchor` without changing its function.

    Args:
        anchor, state: trained states of one method (`trainable_state()` keys).
        matching: 'none' (returned as is), 'permutation', 'rotation' or 'rotation-scaling'.
        kind: 'nlft' (timm blocks) or 'last' (LSA modules).
        num_heads: attention heads (timm blocks' or LSA modules').
        blocks: block indices to match (from `chosen_blocks`).
        ffn: also permute FFN hidden units (nlft only; LSA modules have no FFN).
        model: the tuned model the states belong to (nlft: a `TailFineTune`); its modules and
            head count are checked first (`check_matchable_modules`). Required for nlft.
        head_permutation: also permute whole heads before the per-head step (`fusion.head_permutation`).
    """
    if matching == "none":
        return dict(state)
    if matching not in MATCH_OPTIONS:
        raise ValueError(f"config key 'fusion.matching': unknown matching '{matching}'; "
                         f"choose from {['none', *MATCH_OPTIONS]}")
    rotation, scaling = MATCH_OPTIONS[matching]
    if kind == "nlft":
        if model is None:
            raise ValueError("match_state: nlft matching needs the tuned model, to check its modules")
        return match_to_anchor(anchor, state, num_heads=num_heads, blocks=blocks, ffn=ffn,
                               rotation=rotation, scaling=scaling, model=model.model,
                               head_permutation=head_permutation)
    if kind == "last":
        return match_lsa_state_dict(anchor, state, num_heads=num_heads, module_prefixes=_lsa_prefixes(state, blocks),
                                    rotation=rotation, scaling=scaling, head_permutation=head_permutation)
    raise ValueError(f"config key 'fusion.methods': kind '{kind}' cannot be matched (nlft and last only)")


def num_heads_of(tuned: nn.Module, method_cfg: dict) -> int:
    if method_cfg["kind"] == "last":
        return method_cfg["heads"]
    return tuned.model.blocks[-1].attn.num_heads


@torch.no_grad()
def reinit_tail_blocks(model: TailFineTune, seed: int, std: float = 0.02) -> None:
    """Re-initialize the tuned blocks of an nlft model from `seed` (timm's ViT init: truncated
    normal Linear weights, zero biases, unit LayerNorms). LayerScale factors are kept.

    Raises:
        ValueError: for a parameterized layer of unknown init, naming it.
    """
    g = torch.Generator().manual_seed(seed)
    for i in range(model.start, len(model.model.blocks)):
        for name, m in model.model.blocks[i].named_modules():
            if isinstance(m, nn.Linear):
                w = torch.empty(m.weight.shape, dtype=torch.float32)  # generator draws on the CPU in float32
                nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std, generator=g)
                m.weight.copy_(w)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.LayerNorm):
                m.reset_parameters()
            elif not isinstance(m, LayerScale) and any(True for _ in m.parameters(recurse=False)):
                raise ValueError(f"fusion random_reinit: no init known for 'blocks.{i}.{name}' ({type(m).__name__})")


def prefix_view(tuned: nn.Module) -> FromPrefix:
    """The fusion study's view of a shard model: `FromPrefix` with the trained module as `root`
    (an nlft model's timm model, a side network), so the fusion library's hooks and per-example
    gradients see its Linear layers and `'root.' + key` names each trained tensor."""
    attr = "model" if isinstance(tuned, TailFineTune) else "side" if hasattr(tuned, "side") else None
    if attr is None:
        raise ValueError(f"fusion: tuned model {type(tuned).__name__} is not supported (nlft and last only)")
    return FromPrefix(tuned, root=attr)


def full_state(view: FromPrefix, trained: dict) -> dict:
    """The view's state dict with the trained entries replaced by `trained`."""
    out = {k: v for k, v in view.state_dict().items()}
    for k, v in trained.items():
        out[f"root.{k}"] = v
    return out


def trained_part(full: dict, like: dict) -> dict:
    """The `root.`-prefixed entries of a `FromPrefix` state that correspond to `like`'s keys."""
    return {k: full[f"root.{k}"] for k in like}


def prefix_rows(tuned: nn.Module, store: SampleStore, ids: list[str], features: FeatureCache | None,
                backbone_record: dict, device: torch.device, batch_size: int = 256) -> CachedRows | StoredImages:
    """Frozen-prefix features of these samples as a view read when sliced (O(one batch) held):
    rows of the cached features (`CachedRows`), or the prefix run on a slice's images
    (`StoredImages`, `batch_size` images a pass: `train.eval_batch_size`).

    Args:
        tuned: the tuned model (its `prefix`, and a LAST model's `cache_blocks`).
        store: the prepared dataset.
        ids: sample ids, in view order.
        features: the study's cache, or None (compute from images).
        backbone_record: the backbone's record (normalisation).
        device: where sliced batches go.
        batch_size: images per prefix pass without a cache.
    """
    if features is not None:
        return CachedRows(features, store.rows(ids), device, blocks=getattr(tuned, "cache_blocks", None))
    return StoredImages(store, ids, backbone_record["mean"], backbone_record["std"], device, prefix=tuned.prefix,
                        chunk=batch_size)


def load_features(path: str | None) -> FeatureCache | None:
    """The feature cache (rows = samples-table rows, read on demand), or None."""
    return None if path is None else FeatureCache(path)


def logits_from(template: nn.Module, state: dict, h, batch_size: int = 256) -> torch.Tensor:
    """Logits (n, K) of `template` after loading `state` into it (every trained tensor is replaced);
    `h` as `logits_of_states`'."""
    return logits_of_states(template, [state], h, batch_size)[0]


@torch.no_grad()
def logits_of_states(template: nn.Module, states: list[dict], h, batch_size: int = 256) -> list[torch.Tensor]:
    """Logits (n, K) of each state on the features `h`, read ONE batch at a time for all states
    (the batch's features serve every state: one read or prefix pass of the set, not one per state).

    Args:
        template: the tuned model the states load into.
        states: trained states (`trainable_state()` dicts).
        h: prefix features: a tensor or a sliceable view (`prefix_rows`), read `batch_size` rows a slice.
        batch_size: rows per slice (`train.eval_batch_size`).
    """
    template.eval()
    outs: list[list[torch.Tensor]] = [[] for _ in states]
    for start in range(0, len(h), batch_size):
        batch = h[start:start + batch_size]
        for out, state in zip(outs, states):
            template.load_trainable_state(state)
            out.append(template.forward_from_prefix(batch).cpu())
        release_freed()  # the batch's freed tensors leave the RSS (`job/glibc_malloc.py`)
    return [torch.cat(o) for o in outs]


def reinit_method_config(method_cfg: dict, seed: int) -> dict:
    """The method config a re-initialized shard is built from (last: its own side-network seed)."""
    if method_cfg["kind"] == "last":
        return {**method_cfg, "init_seed": seed}
    if method_cfg["kind"] == "nlft":
        return dict(method_cfg)
    raise ValueError(f"config key 'fusion.methods': kind '{method_cfg['kind']}' has no random_reinit (nlft, last only)")


def reinit_tuned(model, method_cfg: dict, seed: int) -> None:
    """Give a freshly built shard model its own random init (the `random_reinit` setting): an
    nlft model's tuned blocks are re-drawn from `seed`; a side network was already built from
    its own `init_seed` (`reinit_method_config`)."""
    if method_cfg["kind"] == "nlft":
        reinit_tail_blocks(model, seed)
