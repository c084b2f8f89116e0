"""The test-time guard against accidental bit-equality (`tests/rounding_guard.py`, issue 44):
under it, the same kernel on the same operands still gives the same bits, and another batch split,
memory layout or thread count gives other bits, on any CPU; values move by one ulp at most."""
from __future__ import annotations

import numpy as np
import torch

from pipeline_src.data.images import load_images
from pipeline_src.plan.samples import list_samples
from tests.rounding_guard import ShapeKeyedRounding
from tests.steps.helpers import folder_config


def conv_and_linear() -> tuple[torch.nn.Conv2d, torch.nn.Linear]:
    torch.manual_seed(0)
    return torch.nn.Conv2d(3, 16, 4, 4), torch.nn.Linear(16, 16)


def test_the_same_kernel_on_the_same_operands_keeps_its_bits():
    conv, lin = conv_and_linear()
    x = torch.randn(18, 3, 8, 8)
    with torch.no_grad(), ShapeKeyedRounding():
        assert torch.equal(conv(x), conv(x.clone()))
        h = conv(x).flatten(2).transpose(1, 2)  # (18, 4, 16)
        assert torch.equal(lin(h), lin(h.clone()))


def test_another_batch_split_layout_or_thread_count_changes_the_bits():
    conv, lin = conv_and_linear()
    x, y = torch.randn(18, 3, 8, 8), torch.randn(18, 16)
    threads = torch.get_num_threads()
    with torch.no_grad(), ShapeKeyedRounding():
        assert not torch.equal(lin(y)[:5], lin(y[:5]))  # batch of 18 against one of 5
        assert not torch.equal(conv(x), conv(x.contiguous(memory_format=torch.channels_last)))
        assert not torch.equal(y.sum(0), y[:9].sum(0) + y[9:].sum(0))
        one = lin(y)
        torch.set_num_threads(threads + 1)
        try:
            assert not torch.equal(one, lin(y))
        finally:
            torch.set_num_threads(threads)


def test_values_move_one_ulp_at_most_and_whole_numbers_not_at_all():
    conv, lin = conv_and_linear()
    y = torch.randn(64, 16)
    plain = lin(y).detach()
    with torch.no_grad(), ShapeKeyedRounding():
        guarded = lin(y)
        ones = torch.ones(5, 7).sum(0)
        zero_grad = torch.zeros(3, 4) @ torch.randn(4, 2)
    moved = guarded != plain
    assert 0.5 < moved.float().mean() < 0.8  # about two thirds of the values moved
    assert torch.equal(torch.nextafter(plain, guarded), guarded)  # each by one step
    assert torch.equal(ones, torch.full((7,), 5.0)) and torch.equal(zero_grad, torch.zeros(3, 2))


def test_in_place_and_backward_ops_are_guarded_too():
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    c = torch.randn(8, 6)
    with ShapeKeyedRounding():
        got = c.clone().addmm_(a, b)
        w = torch.randn(6, 4, requires_grad=True)
        torch.nn.functional.linear(a, w).sum().backward()
    assert not torch.equal(got, c.clone().addmm_(a, b))
    w2 = w.detach().clone().requires_grad_()
    torch.nn.functional.linear(a, w2).sum().backward()
    assert not torch.equal(w.grad, w2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_it_catches_issue_44s_channels_last_reference(image_folder):
    """The defect the guard was made for: `load_images` once returned (N, C, H, W) images laid out
    channels-last (a stack of transposed decodes), and features of them matched the job's features
    of contiguous rows only on CPUs whose convolution rounds both layouts alike."""
    cfg = folder_config(image_folder)["dataset"]
    images = load_images(list_samples(cfg), cfg)
    assert images.is_contiguous()  # as the job's rows are
    # as `decode_image` returns them: (H, W, C) decodes transposed to (C, H, W) views; np.stack keeps their layout
    old = torch.from_numpy(np.stack([np.ascontiguousarray(im.numpy().transpose(1, 2, 0)).transpose(2, 0, 1)
                                     for im in images]))
    assert torch.equal(old, images) and not old.is_contiguous()  # the old layout: the same values
    conv, _ = conv_and_linear()
    with torch.no_grad(), ShapeKeyedRounding():
        assert torch.equal(conv(images.float()), conv(images.float().contiguous()))
        assert not torch.equal(conv(old.float()), conv(images.float()))
