"""Crop-and-flip pretraining augmentation (`data/crop_flip.py`) against a per-image reference: each
output is a window of the explicitly padded image at the drawn offset, flipped where drawn."""
from __future__ import annotations

import torch

from pipeline_src.data.crop_flip import CropFlipInputs, crop_flip


def reference(x: torch.Tensor, pad: int, flip: bool, fill: list[float], seed: int) -> torch.Tensor:
    """One image at a time, with the same draws (2 * B offsets, then B flips)."""
    gen = torch.Generator().manual_seed(seed)
    n, c, h, w = x.shape
    dy, dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen), torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    flips = torch.rand(n, generator=gen) < 0.5 if flip else torch.zeros(n, dtype=torch.bool)
    out = []
    for i in range(n):
        canvas = torch.empty(c, h + 2 * pad, w + 2 * pad, dtype=x.dtype)
        for ch in range(c):
            canvas[ch] = fill[ch]
        canvas[:, pad:pad + h, pad:pad + w] = x[i]
        window = canvas[:, dy[i]:dy[i] + h, dx[i]:dx[i] + w]
        out.append(window.flip(-1) if flips[i] else window)
    return torch.stack(out)


def test_each_image_is_a_window_of_its_padded_copy_flipped_where_drawn():
    x = torch.randn(16, 2, 7, 5, dtype=torch.float64)
    fill = [-1.0, -2.0]
    for pad, flip in ((2, True), (3, False), (1, True)):
        got = crop_flip(x, pad, flip, fill, torch.Generator().manual_seed(5))
        assert torch.equal(got, reference(x, pad, flip, fill, 5))  # pure indexing: exact


def test_no_pad_and_no_flip_is_the_identity_and_the_draws_move_and_flip_images():
    x = torch.randn(64, 1, 6, 6, dtype=torch.float64)
    assert torch.equal(crop_flip(x, 0, False, [0.0], torch.Generator().manual_seed(0)), x)
    out = crop_flip(x, 2, True, [-1.0], torch.Generator().manual_seed(0))
    changed = (out != x).flatten(1).any(1)
    assert 0.5 < changed.double().mean() < 1.0  # most images move; a few draw offset (2, 2) unflipped
    assert (out == -1.0).flatten(1).any(1).double().mean() > 0.5  # the pad shows in a shifted crop


def test_a_seed_replays_its_batches_and_another_seed_does_not():
    x = torch.randn(10, 1, 8, 8)

    def batches(seed):
        inputs = CropFlipInputs(x, pad=2, flip=True, fill=[-1.0], seed=seed)
        return [inputs[torch.tensor(idx)] for idx in ([0, 3, 5], [1, 2, 9], [0, 3, 5])]

    a, b, c = batches(1), batches(1), batches(2)
    assert len(CropFlipInputs(x, 2, True, [-1.0], 1)) == 10
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not all(torch.equal(p, q) for p, q in zip(a, c))
    assert not torch.equal(a[0], a[2])  # the same images in a later batch get new draws
