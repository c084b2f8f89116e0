"""The fusion statistics stream (issue 25): the Fisher and the RegMean Grams accumulate batch by
batch, so (a) batches of 7 give the one-batch (whole-set) answer to float64 precision, and
(b) a view read one slice at a time (`CachedRows`, `StoredImages` via `prefix_rows`) gives bit for
bit what the eagerly read tensor gives; the fusion step's fused state and test logits too."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_src.data.feature_cache import CachedRows, FeatureCache, FeatureCacheWriter
from pipeline_src.fusion import diagonal_fisher, linear_input_grams
from pipeline_src.methods.fusion_models import logits_from, logits_of_states, prefix_view
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.steps.fusion.fuse import fuse_states
from tests.conftest import tiny_vit

# compares results of different paths (batches, caches, threads): bit-equality only where the
# same kernels see the same operands, checked on any CPU (tests/rounding_guard.py)
pytestmark = pytest.mark.rounding_guard

ROWS = np.array([17, 3, 25, 0, 29, 11, 8, 21, 14, 5, 27, 2, 19, 30, 6, 12, 1, 24, 9, 33, 15, 22])  # 22: 7+7+7+1
METHODS = {"nlft": {"kind": "nlft", "k": 1}, "last": {"kind": "last", "rank": 8, "heads": 2}}


def shard_model(cfg: dict, seed: int, dtype=torch.float32):
    model = build_tuned_model(tiny_vit(seed=0, depth=4).to(dtype), cfg, 5, seed=0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def prefix_cache(tmp_path, model) -> FeatureCache:
    x = torch.randn(34, 1, 16, 16, generator=torch.Generator().manual_seed(3), dtype=next(model.parameters()).dtype)
    h = model.prefix(x).float()
    w = FeatureCacheWriter(tmp_path / "f.npy", h.shape, "float16", {"cache": "test", "blocks": model.cache_blocks}
                           if hasattr(model, "cache_blocks") else {"cache": "test"})
    w.write(0, h)
    w.close()
    return FeatureCache(tmp_path / "f.npy")


def labels() -> torch.Tensor:
    return torch.randint(0, 5, (len(ROWS),), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", ["nlft", "last"])
def test_batched_statistics_equal_the_whole_set_in_float64(kind):
    model = shard_model(METHODS[kind], 1, torch.float64)
    x = torch.randn(len(ROWS), 1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    view, h = prefix_view(model), model.prefix(x)
    whole, streamed = linear_input_grams(view, h, batch_size=len(h)), linear_input_grams(view, h, batch_size=7)
    assert whole.keys() == streamed.keys() and len(whole) > 4
    for k in whole:  # sums of float64 products in another order
        torch.testing.assert_close(streamed[k], whole[k], rtol=1e-12, atol=1e-12 * float(whole[k].abs().max()))
    f_whole, f_streamed = diagonal_fisher(view, h, labels(), len(h)), diagonal_fisher(view, h, labels(), 7)
    scale = max(float(f.abs().max()) for f in f_whole.values())  # some entries are ~0 (zero-init up-projections)
    for k in f_whole:
        torch.testing.assert_close(f_streamed[k], f_whole[k], rtol=1e-10, atol=1e-13 * scale)


@pytest.mark.parametrize("kind", ["nlft", "last"])
@pytest.mark.parametrize("fusion", ["fisher", "regmean"])
def test_fusing_from_a_view_read_per_batch_equals_the_eager_tensor(tmp_path, kind, fusion):
    models = [shard_model(METHODS[kind], s) for s in (1, 2)]
    cache = prefix_cache(tmp_path, models[0])
    blocks = getattr(models[0], "cache_blocks", None)
    halves = [ROWS[:11], ROWS[11:]]
    y = labels()
    states = [m.trainable_state() for m in models]
    eager = [(cache.rows(r, blocks=blocks), y[i * 11:(i + 1) * 11]) for i, r in enumerate(halves)]
    lazy = [(CachedRows(cache, r, blocks=blocks), y[i * 11:(i + 1) * 11]) for i, r in enumerate(halves)]
    a = fuse_states(fusion, states, models[0], eager)
    b = fuse_states(fusion, states, models[0], lazy)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    test_view, test_h = CachedRows(cache, ROWS, blocks=blocks), cache.rows(ROWS, blocks=blocks)
    assert torch.equal(logits_from(models[0], a, test_view, 5), logits_from(models[0], a, test_h, 5))
    both = logits_of_states(models[0], [states[0], a], test_view, 5)  # one read of the set for both states
    assert torch.equal(both[0], logits_from(models[0], states[0], test_h, 5))
    assert torch.equal(both[1], logits_from(models[0], a, test_h, 5))
