"""Crop-and-flip augmentation of pretraining batches (`backbone.pretrain.augment`).

The small-image recipe of He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016,
§4.2, CIFAR-10): "4 pixels are padded on each side, and a 32×32 crop is randomly sampled from the
padded image or its horizontal flip". Here the pad is `pad` pixels of black (the normalised value
of a zero pixel), the crop keeps the image's size, and the flip has probability 1/2.

It runs on whole batches as tensor indexing (no PIL, no worker processes), so it costs little next
to a ViT's step on 28-px images, unlike the timm transform of `train.augment`. The draws come from
one generator seeded by the job's seed, taken in batch order, and the batch order is seeded too
(`methods.training.fit`): a pretraining job replays exactly.
"""
from __future__ import annotations

from typing import Sequence

import torch


def crop_flip(x: torch.Tensor, pad: int, flip: bool, fill: Sequence[float], gen: torch.Generator) -> torch.Tensor:
    """Each image of `x` cropped at a random offset from its `pad`-padded copy, then flipped left-right
    with probability 1/2 (if `flip`).

    Args:
        x: a batch (B, C, H, W), normalised.
        pad: pixels of padding on each side (the crop's offset is uniform in [0, 2 * pad]).
        flip: draw a horizontal flip per image.
        fill: the padding's value per channel (a black pixel, normalised).
        gen: a CPU generator; draws 2 * B offsets, then B flips.
    """
    n, c, h, w = x.shape
    padded = torch.as_tensor(fill, dtype=x.dtype, device=x.device).view(1, c, 1, 1).repeat(n, 1, h + 2 * pad, w + 2 * pad)
    padded[:, :, pad:pad + h, pad:pad + w] = x
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen).to(x.device)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    channel = torch.arange(c, device=x.device)[None, :, None, None]
    out = padded[batch, channel, rows, cols]  # (B, C, H, W)
    if flip:
        flipped = (torch.rand(n, generator=gen) < 0.5).to(x.device)
        out = torch.where(flipped[:, None, None, None], out.flip(-1), out)
    return out


class CropFlipInputs:
    """A training loop's `inputs` (`methods.training.fit`) whose every batch is cropped and flipped.

    Args:
        inputs: the training images: anything with `len`, `device` and `inputs[idx]` (B, C, H, W).
        pad: pixels of padding on each side.
        flip: also flip left-right with probability 1/2.
        fill: the padding's value per channel.
        seed: seeds the draws.
    """

    def __init__(self, inputs, pad: int, flip: bool, fill: Sequence[float], seed: int) -> None:
        self.inputs, self.pad, self.flip, self.fill = inputs, pad, flip, list(fill)
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def device(self) -> torch.device:
        return self.inputs.device

    def __getitem__(self, idx) -> torch.Tensor:
        return crop_flip(self.inputs[idx], self.pad, self.flip, self.fill, self.gen)
