"""Feature caches a study builds, the blocks the `blocks` cache keeps, and their size on disk,
known before any job runs (torch-free: parse time).

A cache holds one row per samples-table row: `last{k}` is (tokens, width) per sample, the
`blocks` cache (len(kept blocks), tokens, width), kept blocks being 0, g, 2g, ..., depth for
every spacing g a LAST configuration of the study uses (its side network reads z_0, z_g, ...,
z_depth, and bias correction subtracts z_0..z_{depth-g}: the same set; Tang et al.,
"Low-Rank Attention Side-Tuning", 2024, and `pipeline_src/last/features.py`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline_src.methods.kinds import LAST_DEFAULTS, feature_cache, kind_of

BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# timm ViT size names -> (width, depth)
VIT_SIZES = {"tiny": (192, 12), "small": (384, 12), "base": (768, 12), "large": (1024, 24), "huge": (1280, 32)}


@dataclass(frozen=True)
class BackboneShape:
    """Token count, width and depth of a backbone, as far as the config tells them.

    Args:
        tokens: tokens per image entering the blocks (prefix tokens + patches).
        width: embedding width.
        depth: number of blocks.
    """

    tokens: int
    width: int
    depth: int


def side_everys(cfg: dict) -> list[int]:
    """Every spacing g that a LAST configuration of the study reads (methods and the LAST grid)."""
    from pipeline_src.plan.last_grid import grid_method, grid_points

    # the method's own default g (LAST_DEFAULTS): a cache built for g = 1 would keep blocks no method reads
    everys = {m.get("every", LAST_DEFAULTS["every"]) for m in cfg["methods"].values() if kind_of(m).side}
    if cfg.get("last_grid", {}).get("enabled") and grid_method(cfg) is not None:
        everys |= {p["every"] for p in grid_points(cfg)}
    return sorted(everys)


def kept_blocks(depth: int, everys: list[int]) -> list[int]:
    """Backbone block indices the `blocks` cache keeps: 0, g, ..., depth for each g (0 = embedding)."""
    bad = [g for g in everys if g < 1 or depth % g]
    if bad:
        raise ValueError(f"LAST every={bad[0]} must be a positive integer dividing the backbone depth {depth}")
    return sorted({k for g in everys for k in range(0, depth + 1, g)})


def study_caches(cfg: dict) -> list[str]:
    """Names of the caches the study builds (none when `features.cache` is false)."""
    if not cfg["features"]["cache"]:
        return []
    return sorted({c for m in cfg["methods"].values() if (c := feature_cache(m)) is not None})


def timm_patch_size(name: str) -> int | None:
    """The patch size a timm ViT name states (`patch<P>`), or None."""
    patch = re.search(r"patch(\d+)", name.split(".")[0])
    return int(patch.group(1)) if patch else None


def timm_shape(name: str, img_size: int | None = None) -> BackboneShape | None:
    """Tokens, width and depth of a common timm ViT from its name alone (no timm import), or None.

    Reads `patch<P>`, the image size (`_<img>` after the patch, as in vit_base_patch16_224),
    the size word (tiny/small/base/large/huge), registers (`reg<R>`) and DeiT's distillation token.

    Args:
        name: the timm model name.
        img_size: the image size it is built at (the study's; timm resamples the position
            embedding), or None for the size in the name.
    """
    base = name.split(".")[0]
    size = next((s for s in VIT_SIZES if f"_{s}_" in f"_{base}_"), None)
    patch = timm_patch_size(base)
    img = re.search(r"patch\d+_(?:[a-z0-9]+_)*?(\d{3,})(?:_|$)", base)
    if img_size is None and img is not None:
        img_size = int(img.group(1))
    if size is None or patch is None or img_size is None:
        return None
    width, depth = VIT_SIZES[size]
    prefix = 1 + (1 if "distilled" in base else 0)
    reg = re.search(r"reg(\d+)", base)
    prefix += int(reg.group(1)) if reg else 0
    return BackboneShape((img_size // patch) ** 2 + prefix, width, depth)


def backbone_shape(cfg: dict) -> BackboneShape | None:
    """The backbone's shape from the config, or None when only loading it would tell."""
    b = cfg["backbone"]
    if b["source"] == "pretrain" or (b["source"] == "checkpoint" and not b["timm_name"]):
        arch = b["arch"]
        patches = (cfg["dataset"]["img_size"] // arch["patch_size"]) ** 2
        return BackboneShape(patches + (1 if arch["class_token"] else 0), arch["embed_dim"], arch["depth"])
    return timm_shape(b["timm_name"], cfg["dataset"]["img_size"])  # built at the study's size


def cache_sizes(cfg: dict, num_samples: int) -> dict[str, int | None]:
    """Estimated bytes of each cache the study builds (None: unknown for this backbone)."""
    shape = backbone_shape(cfg)
    per_value = BYTES[cfg["features"]["dtype"]]
    out: dict[str, int | None] = {}
    for cache in study_caches(cfg):
        if shape is None:
            out[cache] = None
            continue
        layers = len(kept_blocks(shape.depth, side_everys(cfg))) if cache == "blocks" else 1
        out[cache] = num_samples * layers * shape.tokens * shape.width * per_value
    return out


def human_size(num_bytes: int) -> str:
    """Bytes as '3.45 MB' / '45.4 GB' (powers of 1000)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes / 1e3:.3g} kB"


def image_store_line(cfg: dict, num_samples: int) -> str:
    """The size of `prepare`'s image store (uint8 N x C x H x W, `results/<experiment>/prepare/images.npy`),
    which every study builds: one line for validation to print beside the caches."""
    d = cfg["dataset"]
    size = num_samples * d["in_chans"] * d["img_size"] ** 2
    return (f"image store 'results/{cfg.get('experiment', '<experiment>')}/prepare/images.npy': {human_size(size)} "
            f"({num_samples} images x {d['in_chans']} x {d['img_size']} x {d['img_size']} x uint8)")


def budget_report(cfg: dict, num_samples: int) -> tuple[list[str], str | None]:
    """(one line per cache with its estimated size, an error naming the first cache over
    `features.max_cache_gb`, or None).

    Args:
        cfg: the validated config.
        num_samples: rows of the samples table (every sample is cached).
    """
    limit = cfg["features"]["max_cache_gb"]
    lines, error = [], None
    shape = backbone_shape(cfg)
    for cache, size in cache_sizes(cfg, num_samples).items():
        if size is None:
            lines.append(f"feature cache '{cache}': size unknown (backbone '{cfg['backbone']['timm_name']}' "
                         f"not recognised from its name); {num_samples} samples, {cfg['features']['dtype']}")
            continue
        lines.append(f"feature cache '{cache}': {human_size(size)} ({num_samples} samples x {shape.tokens} tokens x "
                     f"{shape.width} x {cfg['features']['dtype']}"
                     + (f", blocks {kept_blocks(shape.depth, side_everys(cfg))})" if cache == "blocks" else ")"))
        if error is None and limit is not None and size > limit * 1e9:
            error = (f"config key 'features.max_cache_gb': the '{cache}' feature cache would take about "
                     f"{human_size(size)}, over the limit of {limit:g} GB; set features.cache: false to train "
                     f"from images (frozen backbone under no_grad), use features.dtype float16, or raise the limit")
    return lines, error
