"""Frozen-backbone features for LAST side networks.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024. The backbone is a frozen feature
extractor: it runs once per image under `torch.no_grad()` and never sees a backward
pass, so none of its activations is kept for autograd.

Which tensors are returned (backbone of depth L, side-block spacing g = `every`, m = L/g):
    z_0 = norm_pre(pos_drop(_pos_embed(patch_embed(x))))  -- patch tokens with the
          prefix (CLS / register) tokens concatenated and the position embedding added,
          exactly the input of `backbone.blocks[0]`;
    z_i = output of backbone block i·g (1-based), i = 1..m, i.e. the output of
          `backbone.blocks[i*g - 1]`, *before* the final `backbone.norm`.
So z_m is the output of the last block, and g must divide L.

Cached form: `extract_feature_dict` keys tensors by **backbone block index**:
"z0" is z_0 and "z{k}" is the output of block k (1-based). With every=1 this is
"z0".."zL". Keying by block index (not by side-block index) lets one cache extracted
with every=1 serve side networks of any spacing g (they read "z0", "zg", "z2g", ...);
`side_inputs` does that selection and names any missing key.

Trainers draw these features one batch at a time through `BlockBatches`: either such a dict or
one stacked source (n, len(blocks), N, D), e.g. `data.feature_cache.CachedRows` over a `blocks`
cache, which is read once per batch (only the batch's rows) and split per block.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor


def check_every(backbone: VisionTransformer, every: int) -> int:
    """Validate the side-block spacing g and return m = depth / g.

    Args:
        backbone: the frozen timm VisionTransformer.
        every: g, the number of backbone blocks between two side blocks.
    """
    depth = len(backbone.blocks)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1 or depth % every != 0:
        raise ValueError(f"LAST: every={every!r} must be a positive integer dividing the backbone depth {depth}")
    return depth // every


def feature_keys(depth: int, every: int) -> list[str]:
    """Cache keys read by a side network of spacing `every`: "z0", "z{g}", ..., "z{depth}"."""
    if every < 1 or depth % every != 0:
        raise ValueError(f"LAST: every={every} must be a positive integer dividing depth {depth}")
    return [f"z{k}" for k in range(0, depth + 1, every)]


def extract_features(backbone: VisionTransformer, x: Tensor, *, every: int) -> list[Tensor]:
    """One no-grad forward of the backbone returning [z_0, z_1, ..., z_m] (see module doc).

    The backbone is run in eval mode (dropout / drop-path off, as a frozen feature
    extractor) and its previous train/eval mode is restored afterwards. The outputs
    have `requires_grad=False` and no `grad_fn`.

    Args:
        backbone: timm VisionTransformer (not modified).
        x: images, shape (B, C, H, W).
        every: g; side blocks read the output of every g-th backbone block.

    Returns:
        m + 1 tensors of shape (B, N, D), N = prefix tokens + patches.
    """
    check_every(backbone, every)
    was_training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            h = backbone.patch_embed(x)
            h = backbone._pos_embed(h)  # (B, N, D), prefix tokens + position embedding
            h = backbone.patch_drop(h)
            h = backbone.norm_pre(h)
            out = [h]
            for k, blk in enumerate(backbone.blocks, start=1):
                h = blk(h)
                if k % every == 0:
                    out.append(h)
    finally:
        backbone.train(was_training)
    return out


def block_outputs(backbone: VisionTransformer, x: Tensor, blocks: Sequence[int]) -> Tensor:
    """The outputs of these backbone blocks (0 = the embedding), stacked (B, len(blocks), N, D),
    from ONE no-grad forward (every block's output lies on the way to the last one).

    Args:
        backbone: timm VisionTransformer (not modified).
        x: images, shape (B, C, H, W).
        blocks: backbone block indices, any order (dim 1 follows it).
    """
    feats = extract_features(backbone, x, every=1)
    return torch.stack([feats[k] for k in blocks], dim=1)


def extract_feature_dict(
    backbone: VisionTransformer,
    images: Tensor,
    *,
    every: int = 1,
    chunk_size: int = 256,
    device: str | torch.device | None = None,
    out_dtype: torch.dtype | None = None,
) -> dict[str, Tensor]:
    """Features of a whole image tensor, computed in chunks, for caching to disk.

    Args:
        backbone: timm VisionTransformer (not modified; it must already be on `device`).
        images: all images, shape (N_img, C, H, W), on any device.
        every: g; keep the outputs of blocks g, 2g, ..., depth (use 1 to serve every g).
        chunk_size: images per forward.
        device: where the forward runs; defaults to the backbone's device.
        out_dtype: dtype of the stored features (default: the backbone's output dtype).

    Returns:
        {"z0": (N_img, N, D), "z{g}": ..., "z{depth}": ...} on the CPU, keyed by backbone
        block index (see module doc).
    """
    if chunk_size < 1:
        raise ValueError(f"LAST extract_feature_dict: chunk_size={chunk_size} must be >= 1")
    check_every(backbone, every)
    keys = feature_keys(len(backbone.blocks), every)
    dev = torch.device(device) if device is not None else next(backbone.parameters()).device
    parts: dict[str, list[Tensor]] = {k: [] for k in keys}
    for start in range(0, images.shape[0], chunk_size):
        chunk = images[start:start + chunk_size].to(dev)
        for key, z in zip(keys, extract_features(backbone, chunk, every=every)):
            parts[key].append(z.to("cpu", dtype=out_dtype or z.dtype))
    return {k: torch.cat(v) if v else torch.empty(0) for k, v in parts.items()}


def side_inputs(features: Mapping[str, Tensor], *, every: int, depth: int) -> list[Tensor]:
    """Select [z_0, z_1, ..., z_m] for spacing `every` from a block-indexed feature dict.

    Args:
        features: dict keyed "z0".."z{depth}" (any superset of the needed keys).
        every: g of the side network.
        depth: backbone depth L.
    """
    keys = feature_keys(depth, every)
    missing = [k for k in keys if k not in features]
    if missing:
        raise KeyError(f"LAST features: missing keys {missing} for every={every}, depth={depth}; "
                       f"have {sorted(features)} (extract with every=1 to serve any spacing)")
    return [features[k] for k in keys]


class BlockBatches:
    """Block-indexed features ("z0", "z{k}", ...) of n samples, drawn one batch at a time.

    Args:
        features: a dict {"z{k}": (n, N, D)}, or one stacked source of shape (n, len(blocks), N, D)
            indexable by a tensor of positions (a tensor, or `CachedRows` that reads only those rows).
        blocks: the backbone block index of each position of a stacked source's dim 1 (dicts: None).
    """

    def __init__(self, features: Mapping[str, Tensor] | Any, blocks: Sequence[int] | None = None) -> None:
        self.stacked = not isinstance(features, Mapping)
        if self.stacked:
            if blocks is None:
                raise ValueError("LAST BlockBatches: a stacked feature source needs its block indices")
            if features.shape[1] != len(blocks):
                raise ValueError(f"LAST features: dim 1 holds {features.shape[1]} block outputs, expected blocks "
                                 f"{list(blocks)}; read a blocks cache with those blocks")
            self.keys = [f"z{b}" for b in blocks]
        else:
            self.keys = list(features)
        self.features = features
        self.lengths = {"stacked": len(features)} if self.stacked else {k: v.shape[0] for k, v in features.items()}

    def __len__(self) -> int:
        return next(iter(self.lengths.values()), 0)

    def __contains__(self, key: str) -> bool:
        return key in self.keys

    def select(self, *, every: int, depth: int) -> list[str]:
        """The keys a side network of spacing `every` reads (`side_inputs`'s error names missing ones)."""
        keys = feature_keys(depth, every)
        side_inputs({k: None for k in self.keys}, every=every, depth=depth)
        return keys

    def batch(self, idx: Tensor, keys: Sequence[str]) -> dict[str, Tensor]:
        """{key: (B, N, D)} of the samples at positions `idx` (one read of a stacked source)."""
        if not self.stacked:
            return {k: self.features[k][idx] for k in keys}
        h = self.features[idx]  # (B, len(blocks), N, D)
        # contiguous: each block's batch laid out as a dict entry's `z[idx]` is, so results match it bit for bit
        return {k: h[:, self.keys.index(k)].contiguous() for k in keys}
