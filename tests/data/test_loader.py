"""The DataLoader data path (`data/loader.py`): the same rows, in order, whatever the worker count."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_src.data.images import to_model_input
from pipeline_src.data.loader import image_batches
from pipeline_src.data.sample_store import SampleStore, StoredImages
from tests.steps.helpers import folder_config, run_prepare

# compares results of different paths (batches, caches, threads): bit-equality only where the
# same kernels see the same operands, checked on any CPU (tests/rounding_guard.py)
pytestmark = pytest.mark.rounding_guard


def test_batches_are_the_rows_in_order_with_and_without_workers(image_folder, tmp_path):
    store = SampleStore(run_prepare(folder_config(image_folder), tmp_path))
    rows = np.array([5, 0, 17, 3, 3, 9, 11])
    expected = store.image_array.read(rows)
    for workers in (0, 2):
        batches = list(image_batches(store.image_array, rows, 3, "cpu", workers))
        assert [len(b) for b in batches] == [3, 3, 1]
        assert all(b.dtype == torch.uint8 for b in batches)
        assert np.array_equal(torch.cat(batches).numpy(), expected)


def test_apply_equals_the_whole_split_at_once(image_folder, tmp_path):
    store = SampleStore(run_prepare(folder_config(image_folder), tmp_path))
    ids = store.ids("target", "train")[::-1]
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    # flatten, not a sum: a sum's rounding may depend on the batch's shape (tests/rounding_guard.py);
    # the conversion is elementwise (each value rounded once), so batches equal the whole bit for bit
    reference = to_model_input(store.subset(ids).images, mean, std).flatten(1)
    for workers in (0, 2):
        out = store.apply(lambda x: x.flatten(1), ids, mean, std, batch_size=4, workers=workers)
        assert torch.equal(out, reference)


def test_stored_images_are_the_whole_split_indexed(image_folder, tmp_path):
    # what `pretrain` trains on: each batch read when drawn equals indexing the whole split's tensor
    store = SampleStore(run_prepare(folder_config(image_folder), tmp_path))
    ids = store.ids("target", "train")
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    whole = to_model_input(store.subset(ids).images, mean, std)
    lazy = StoredImages(store, ids, mean, std, "cpu")
    assert len(lazy) == len(ids)
    for idx in (torch.tensor([3, 0, 3, 1]), torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))):
        assert torch.equal(lazy[idx], whole[idx])


def test_stored_prefix_runs_the_frozen_part_on_each_batch(image_folder, tmp_path):
    # training without a feature cache: the prefix of each drawn batch, never of the whole shard
    store = SampleStore(run_prepare(folder_config(image_folder), tmp_path))
    ids = store.ids("target", "train")
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    torch.manual_seed(0)
    frozen = torch.nn.Conv2d(3, 2, kernel_size=3).double()  # per-sample, so any batching gives the same values
    prefix = lambda x: frozen(x.double())  # noqa: E731
    with torch.no_grad():
        whole = prefix(to_model_input(store.subset(ids).images, mean, std))
    lazy = StoredImages(store, ids, mean, std, "cpu", prefix=prefix, chunk=3)
    assert lazy.shape == tuple(whole.shape) and len(lazy) == len(ids)
    idx = torch.randperm(len(ids), generator=torch.Generator().manual_seed(1))[:5]
    torch.testing.assert_close(lazy[idx], whole[idx], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lazy[1:6], whole[1:6], rtol=1e-12, atol=1e-12)  # a slice: chunks of 3
    torch.testing.assert_close(lazy[:], whole, rtol=1e-12, atol=1e-12)
    assert not lazy[idx].requires_grad  # no graph through the frozen part
