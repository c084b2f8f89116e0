"""Training from `CachedRows` (a shard's cache rows read one batch at a time) gives bit for bit
the model that training from the eagerly read float32 tensor gives (issue 12): the same rows in
the same order, the same float32 conversion. Every trainer of the DAG is checked: fit (fc, nlft),
TAFT (one shard and vectorized over shards), LAST (one side network through the registry, and a
grid), against the whole-tensor path and, for LAST, the block dict the trainers took before."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_src.data.feature_cache import CachedRows, FeatureCache, FeatureCacheWriter
from pipeline_src.last import train_side_grid, train_side_network
from pipeline_src.last.features import BlockBatches
from pipeline_src.methods.registry import build_tuned_model, get_method
from pipeline_src.methods.training import batched_apply
from pipeline_src.taft.train import train_tangent_vectorized
from tests.conftest import tiny_vit

# compares results of different paths (batches, caches, threads): bit-equality only where the
# same kernels see the same operands, checked on any CPU (tests/rounding_guard.py)
pytestmark = pytest.mark.rounding_guard

ROWS = np.array([17, 3, 25, 0, 29, 11, 8, 21, 14, 5, 27, 2, 19])  # unsorted; 13 rows: a short last batch
SETTINGS = {"epochs": 2, "batch_size": 4, "lr": 1e-2, "weight_decay": 0.01, "schedule": None}


def cache_of(path, x: torch.Tensor, **meta) -> FeatureCache:
    """`x` stored in float16, as the default `features.dtype`, so every read converts."""
    w = FeatureCacheWriter(path, x.shape, "float16", {"cache": "test", **meta})
    w.write(0, x)
    w.close()
    return FeatureCache(path)


def backbone():
    return tiny_vit(seed=0, depth=4).float()  # 17 tokens of width 32


def labels_of(n: int) -> torch.Tensor:
    return torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(n))


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def train_both(cfg: dict, cache: FeatureCache, blocks=None) -> tuple[dict, dict]:
    """The trainable state after training from the eager tensor and from `CachedRows`."""
    states = []
    for lazy in (False, True):
        model = build_tuned_model(backbone(), cfg, 5, seed=0)
        blocks_ = getattr(model, "cache_blocks", None)
        feats = CachedRows(cache, ROWS, blocks=blocks_) if lazy else cache.rows(ROWS, blocks=blocks_)
        get_method(cfg["kind"]).train(model, feats, labels_of(len(ROWS)), {**SETTINGS, "method": cfg}, 7, "test")
        states.append(model.trainable_state())
    return states[0], states[1]


@pytest.mark.parametrize("cfg", [{"kind": "fc"}, {"kind": "nlft", "k": 1}, {"kind": "taft", "k": 1}],
                         ids=["fc", "nlft", "taft"])
def test_prefix_methods_train_the_same_from_cached_rows(tmp_path, cfg):
    cache = cache_of(tmp_path / "f.npy", torch.randn(30, 17, 32))  # last1: the input of the last block
    eager, lazy = train_both(cfg, cache)
    assert_same_state(eager, lazy)
    assert not torch.equal(eager[next(iter(eager))], build_tuned_model(backbone(), cfg, 5, 0).trainable_state()[
        next(iter(eager))])  # it trained


def test_last_trains_the_same_from_cached_rows_and_from_the_old_block_dict(tmp_path):
    cfg = {"kind": "last", "rank": 4, "heads": 2, "every": 2}
    x = torch.randn(30, 5, 17, 32)  # blocks 0..4 kept: the model reads 0, 2, 4
    cache = cache_of(tmp_path / "f.npy", x, blocks=[0, 1, 2, 3, 4])
    eager, lazy = train_both(cfg, cache)
    assert_same_state(eager, lazy)
    # the dict the trainer took before `BlockBatches`: one (n, N, D) view per block
    model = build_tuned_model(backbone(), cfg, 5, seed=0)
    h = cache.rows(ROWS, blocks=model.cache_blocks)
    member = {**model.member, "lr": SETTINGS["lr"], "weight_decay": SETTINGS["weight_decay"]}
    old = train_side_network(model.backbone, {f"z{b}": h[:, j] for j, b in enumerate(model.cache_blocks)},
                             labels_of(len(ROWS)), member, num_classes=5, epochs=2, batch_size=4, seed=7)
    assert_same_state(old, lazy)


def test_last_grid_trains_the_same_from_cached_rows(tmp_path):
    blocks = [0, 1, 2, 3, 4]
    cache = cache_of(tmp_path / "f.npy", torch.randn(30, 5, 17, 32), blocks=blocks)
    members = [dict(rank=4, heads=2, every=2, lr=1e-2, seed=1), dict(rank=4, heads=2, every=1, lr=3e-3, seed=2)]
    kw = dict(num_classes=5, epochs=2, batch_size=4, seed=7)
    h = cache.rows(ROWS)
    old = train_side_grid(backbone(), {f"z{b}": h[:, j] for j, b in enumerate(blocks)}, labels_of(len(ROWS)),
                          members, **kw)
    lazy = train_side_grid(backbone(), BlockBatches(CachedRows(cache, ROWS), blocks), labels_of(len(ROWS)),
                           members, **kw)
    for a, b in zip(old, lazy):
        assert_same_state(a, b)


def test_vectorized_taft_trains_the_same_from_cached_rows(tmp_path):
    cache = cache_of(tmp_path / "f.npy", torch.randn(30, 17, 32))
    shards = [ROWS[:9], ROWS[9:]]  # sizes 9 and 4: the smaller shard idles in its second step
    out = []
    for lazy in (False, True):
        model = build_tuned_model(backbone(), {"kind": "taft", "k": 1}, 5, seed=0)
        data = [(CachedRows(cache, r) if lazy else cache.rows(r), labels_of(len(r))) for r in shards]
        out.append(train_tangent_vectorized(model, data, epochs=2, batch_size=4, lr=1e-2, seed=[3, 4]))
    for a, b in zip(*out):
        assert_same_state(a["delta_state_dict"], b["delta_state_dict"])
        assert a["loss_history"] == b["loss_history"]


def test_cached_rows_reads_positions_and_slices_and_names_bad_rows(tmp_path):
    x = torch.randn(30, 3, 2, 4)
    cache = cache_of(tmp_path / "f.npy", x, blocks=[0, 2, 4])
    view = CachedRows(cache, ROWS, blocks=[4, 0])
    assert len(view) == 13 and view.shape == (13, 2, 2, 4)
    full = cache.rows(ROWS, blocks=[4, 0])
    assert torch.equal(view[torch.tensor([12, 0, 0])], full[[12, 0, 0]])
    assert torch.equal(view[2:7], full[2:7]) and torch.equal(view[:], full)
    assert torch.equal(batched_apply(lambda t: t * 2, view, 5), full * 2)
    with pytest.raises(IndexError, match="row 30 out of range"):
        CachedRows(cache, [0, 30])
    with pytest.raises(KeyError, match=r"keeps blocks \[0, 2, 4\], not \[1\]"):
        CachedRows(cache, ROWS, blocks=[1])
