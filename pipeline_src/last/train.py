"""Training one LAST side network on cached frozen-backbone features.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024.

A *member* is a dict describing one side network and its optimizer:
    rank, heads (required); every=1, modules_per_block=1, bias_correction=True,
    zero_init_up=False, qkv_bias=True, proj_bias=True, ffn_hidden=0, seed=0 (init seed),
    lr=1e-3, weight_decay=0.0 (AdamW, betas (0.9, 0.999), eps 1e-8).
Cross-entropy loss, no augmentation (features are cached). The batch order depends only
on (n, batch_size, epochs, seed), so every member of a grid (`grid.py`) sees the same
batches as when trained alone here.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from pipeline_src.job.counters import counting
from pipeline_src.last.features import BlockBatches
from pipeline_src.last.side_network import SideNetwork
from pipeline_src.optim.adamw import adamw
from pipeline_src.optim.schedule import apply_schedule

MEMBER_DEFAULTS: dict = {
    "every": 1, "modules_per_block": 1, "bias_correction": True, "zero_init_up": False,
    "qkv_bias": True, "proj_bias": True, "ffn_hidden": 0, "seed": 0, "lr": 1e-3, "weight_decay": 0.0,
}
REQUIRED_KEYS = ("rank", "heads")
# Members sharing these values have identical parameter shapes and forward: one stacked group (`grid.py`).
ARCH_KEYS = ("rank", "heads", "every", "modules_per_block", "bias_correction", "qkv_bias", "proj_bias", "ffn_hidden")

Progress = Callable[[int, int, Tensor], None]  # (epoch, step, per-member losses) -> None


def normalize_member(member: Mapping) -> dict:
    """Fill defaults and reject unknown or missing keys, naming them."""
    unknown = sorted(set(member) - set(MEMBER_DEFAULTS) - set(REQUIRED_KEYS))
    if unknown:
        raise ValueError(f"LAST member: unknown keys {unknown}; allowed {sorted([*MEMBER_DEFAULTS, *REQUIRED_KEYS])}")
    missing = [k for k in REQUIRED_KEYS if k not in member]
    if missing:
        raise ValueError(f"LAST member: missing required keys {missing}")
    out = {**MEMBER_DEFAULTS, **member}
    if out["lr"] <= 0 or out["weight_decay"] < 0:
        raise ValueError(f"LAST member: need lr > 0 and weight_decay >= 0, got lr={out['lr']}, "
                         f"weight_decay={out['weight_decay']}")
    return out


def build_side_network(backbone: VisionTransformer, member: Mapping, *, num_classes: int) -> SideNetwork:
    """The side network a member describes, on the backbone's device and dtype."""
    m = normalize_member(member)
    return SideNetwork(backbone, rank=m["rank"], heads=m["heads"], every=m["every"],
                       modules_per_block=m["modules_per_block"], num_classes=num_classes,
                       bias_correction=m["bias_correction"], zero_init_up=m["zero_init_up"], seed=m["seed"],
                       qkv_bias=m["qkv_bias"], proj_bias=m["proj_bias"], ffn_hidden=m["ffn_hidden"])


def batch_order(n: int, *, batch_size: int, epochs: int, seed: int) -> list[Tensor]:
    """Index batches for all epochs: a fresh permutation per epoch, last batch may be short."""
    if n < 1 or batch_size < 1 or epochs < 0:
        raise ValueError(f"LAST batch_order: need n >= 1, batch_size >= 1, epochs >= 0; got {n}, {batch_size}, {epochs}")
    g = torch.Generator().manual_seed(seed)
    return [idx for _ in range(epochs) for idx in torch.randperm(n, generator=g).split(batch_size)]


def check_dataset(features: Mapping[str, Tensor] | BlockBatches, labels: Tensor, num_classes: int) -> int:
    """Validate block-indexed features (a dict or `BlockBatches`) against labels; return the number of samples."""
    source = features if isinstance(features, BlockBatches) else BlockBatches(features)
    if not source.keys:
        raise ValueError("LAST: empty feature dict")
    n = labels.shape[0]
    bad = {k: m for k, m in source.lengths.items() if m != n}
    if bad:
        raise ValueError(f"LAST: feature rows {bad} do not match {n} labels")
    if labels.dtype != torch.long or labels.dim() != 1:
        raise ValueError(f"LAST: labels must be a 1-D int64 tensor, got {labels.dtype} of shape {tuple(labels.shape)}")
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"LAST: labels outside [0, {num_classes})")
    return n


def train_side_network(backbone: VisionTransformer, features: Mapping[str, Tensor] | BlockBatches, labels: Tensor, member: Mapping,
                       *, num_classes: int, epochs: int, batch_size: int, seed: int,
                       progress: Progress | None = None, schedule: dict | None = None) -> dict[str, Tensor]:
    """Train one side network with torch.optim.AdamW; return its state dict (on the CPU).

    Args:
        backbone: the frozen backbone the features came from (read for shapes and norms only).
        features: block-indexed feature dict ("z0".."z{depth}", see `features.py`), on any device, or
            `BlockBatches` (e.g. over a blocks cache read one batch at a time).
        labels: (N,) int64 class indices.
        member: side network + optimizer description (see module doc).
        num_classes: classifier outputs.
        epochs: passes over the data.
        batch_size: samples per step.
        seed: data-order seed (shared by all members of a grid).
        progress: optional callback (epoch, step, loss of shape (1,)).
        schedule: `train.schedule` (`optim/schedule.py`), per optimizer step; None: constant lr.
    """
    m = normalize_member(member)
    source = features if isinstance(features, BlockBatches) else BlockBatches(features)
    n = check_dataset(source, labels, num_classes)
    net = build_side_network(backbone, m, num_classes=num_classes)
    dev = next(net.parameters()).device
    opt = adamw(net.parameters(), lr=m["lr"], weight_decay=m["weight_decay"])
    keys = source.select(every=m["every"], depth=len(backbone.blocks))
    steps_per_epoch = -(-n // batch_size)
    for step, idx in enumerate(batch_order(n, batch_size=batch_size, epochs=epochs, seed=seed)):
        batch = [z.to(dev) for z in source.batch(idx, keys).values()]
        with counting("train", len(idx), dev, memory=True):
            loss = F.cross_entropy(net(batch), labels[idx].to(dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            apply_schedule(opt, m["lr"], schedule, step, steps_per_epoch, epochs * steps_per_epoch)
            opt.step()
        if progress is not None:
            progress(step // steps_per_epoch, step, loss.detach().reshape(1))
    return {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
