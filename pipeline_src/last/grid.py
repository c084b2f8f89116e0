"""Train a grid of LAST side networks at once on the same frozen features.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024 -- side networks never backpropagate into the
backbone, so many of them (learning rates, seeds, ranks, heads, g, T) can train on one
set of extracted features in parallel.

How: members are grouped by architecture (`train.ARCH_KEYS`). Within a group the
parameters are stacked with `torch.func.stack_module_state` (leading member dim M) and kept
as one flat (M, P) tensor. The forward is `low_rank_stream.stacked_logits`: the same function
as each member's `SideNetwork`, with the D-wide products of the shared features done once for
the whole group (one matmul) and no per-member D-wide residual stream, so a member costs
far less than a network alone.
One AdamW step updates a whole group at once with per-member learning rates and weight
decays broadcast over the member dim. It matches `torch.optim.AdamW` (single-tensor
formula) so a grid member equals the same member trained alone by `train_side_network`
(same batch order: `train.batch_order`) up to float rounding.
"""
from __future__ import annotations

import copy
from typing import Mapping

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor
from torch.func import stack_module_state

from pipeline_src.job.counters import counting
from pipeline_src.last.features import BlockBatches, feature_keys, side_inputs
from pipeline_src.last.low_rank_stream import stacked_logits
from pipeline_src.last.train import (
    ARCH_KEYS,
    Progress,
    batch_order,
    build_side_network,
    check_dataset,
    normalize_member,
)
from pipeline_src.optim.schedule import lr_factor
from pipeline_src.optim.stacked_adamw import stacked_adamw_


class _Group:
    """Members of one architecture; all their parameters in one (M, P) tensor (M members, P
    parameters each), so that one AdamW step is a few whole-tensor operations."""

    def __init__(self, backbone: VisionTransformer, members: list[dict], index: list[int], num_classes: int) -> None:
        nets = [build_side_network(backbone, m, num_classes=num_classes) for m in members]
        self.index, self.every, self.depth = index, nets[0].every, nets[0].depth
        params, self.buffers = stack_module_state(nets)  # name -> (M, *shape)
        self.base = copy.deepcopy(nets[0]).to("meta")  # stateless skeleton: the architecture
        self.names = list(params)
        self.shapes = [params[k].shape[1:] for k in self.names]
        self.flat = torch.cat([params[k].detach().flatten(1) for k in self.names], 1).requires_grad_(True)  # (M, P)
        self.lr = self.flat.new_tensor([m["lr"] for m in members]).unsqueeze(1)  # (M, 1)
        self.wd = self.flat.new_tensor([m["weight_decay"] for m in members]).unsqueeze(1)
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        self.t = 0
        self.lr_factor = 1.0  # the schedule's factor for the next step (`train_side_grid`)

    def params(self) -> dict[str, Tensor]:
        """name -> (M, *shape) views of the flat parameters (differentiable)."""
        chunks = self.flat.split([s.numel() for s in self.shapes], 1)
        return {k: t.view(-1, *s) for k, t, s in zip(self.names, chunks, self.shapes)}

    def logits(self, feats: list[Tensor]) -> Tensor:
        """(M, B, num_classes) logits of all members on one shared batch."""
        return stacked_logits(self.base, {**self.params(), **self.buffers}, feats)

    def step(self, feats: list[Tensor], labels: Tensor) -> Tensor:
        """One AdamW step of every member; returns the (M,) losses before the step."""
        logits = self.logits(feats)  # (M, B, C)
        losses = F.cross_entropy(logits.flatten(0, 1), labels.repeat(logits.shape[0]),
                                 reduction="none").view(logits.shape[:2]).mean(1)  # (M,)
        # Members are independent, so d(sum of losses)/d(member j) = d(loss_j)/d(member j).
        (grad,) = torch.autograd.grad(losses.sum(), [self.flat])  # (M, P)
        self.t += 1
        stacked_adamw_(self.flat, grad, self.exp_avg, self.exp_avg_sq, self.t, self.lr * self.lr_factor,
                       self.wd)
        return losses.detach()

    def state_dicts(self) -> list[dict[str, Tensor]]:
        """One CPU state dict per member, in group order."""
        stacked = {**self.params(), **self.buffers}
        return [{k: v[j].detach().cpu().clone() for k, v in stacked.items()} for j in range(len(self.index))]


class SideGrid:
    """A grid of side networks trained in lockstep on shared batches.

    Args:
        backbone: the frozen backbone (read for shapes and norms only).
        members: member dicts (see `train.py`), any mix of architectures.
        num_classes: classifier outputs, shared by all members.
    """

    def __init__(self, backbone: VisionTransformer, members: list[Mapping], *, num_classes: int) -> None:
        if not members:
            raise ValueError("SideGrid: members is empty")
        norm = [normalize_member(m) for m in members]
        by_arch: dict[tuple, list[int]] = {}
        for i, m in enumerate(norm):
            by_arch.setdefault(tuple(m[k] for k in ARCH_KEYS), []).append(i)
        self.num_members = len(norm)
        self.depth = len(backbone.blocks)
        self.groups = [_Group(backbone, [norm[i] for i in idx], idx, num_classes) for idx in by_arch.values()]
        self.keys = sorted({k for g in self.groups for k in feature_keys(self.depth, g.every)},
                           key=lambda k: int(k[1:]))  # cache keys any member reads

    def step(self, batch: Mapping[str, Tensor], labels: Tensor) -> Tensor:
        """One optimizer step of every member on one batch; returns (num_members,) losses.

        Args:
            batch: block-indexed features of the batch ("z0".., see `features.py`), on the grid's device.
            labels: (B,) int64.
        """
        losses = torch.empty(self.num_members, dtype=torch.float64)
        for g in self.groups:
            feats = side_inputs(batch, every=g.every, depth=self.depth)
            losses[g.index] = g.step(feats, labels).to("cpu", torch.float64)
        return losses

    def state_dicts(self) -> list[dict[str, Tensor]]:
        """One CPU state dict per member, in the order the members were given."""
        out: list[dict[str, Tensor]] = [{} for _ in range(self.num_members)]
        for g in self.groups:
            for j, sd in zip(g.index, g.state_dicts()):
                out[j] = sd
        return out


def train_side_grid(backbone: VisionTransformer, features: Mapping[str, Tensor] | BlockBatches, labels: Tensor, members: list[Mapping],
                    *, num_classes: int, epochs: int, batch_size: int, seed: int,
                    progress: Progress | None = None, schedule: dict | None = None) -> list[dict[str, Tensor]]:
    """Train all members at once; return their state dicts in the given order.

    Equivalent (to float rounding) to `[train_side_network(..., member=m, ...) for m in members]`.

    Args:
        backbone: the frozen backbone the features came from.
        features: block-indexed feature dict ("z0".."z{depth}"; extract with every=1 to serve any g), or
            `BlockBatches` (e.g. over a blocks cache read one batch at a time).
        labels: (N,) int64 class indices.
        members: member dicts (see `train.py`).
        num_classes: classifier outputs.
        epochs: passes over the data.
        batch_size: samples per step.
        seed: data-order seed shared by all members.
        progress: optional callback (epoch, step, per-member losses of shape (num_members,)).
        schedule: `train.schedule`, the same factor for every member at each step.
    """
    source = features if isinstance(features, BlockBatches) else BlockBatches(features)
    n = check_dataset(source, labels, num_classes)
    grid = SideGrid(backbone, members, num_classes=num_classes)
    keys = [k for k in grid.keys if k in source]
    dev = next(backbone.parameters()).device
    steps_per_epoch = -(-n // batch_size)
    for step, idx in enumerate(batch_order(n, batch_size=batch_size, epochs=epochs, seed=seed)):
        batch = {k: z.to(dev) for k, z in source.batch(idx, keys).items()}
        for g in grid.groups:
            g.lr_factor = lr_factor(schedule or {}, step, steps_per_epoch, epochs * steps_per_epoch)
        with counting("train", len(idx), dev):  # each image through every member
            losses = grid.step(batch, labels[idx].to(dev))
        if progress is not None:
            progress(step // steps_per_epoch, step, losses)
    return grid.state_dicts()
