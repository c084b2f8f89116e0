"""fc, nlft and last shards trained stacked in one call equal each shard trained alone by the
method's own `train` (float64, tiny ViT): same init, batch order, schedule; shards of unequal size."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.methods.registry import build_tuned_model, get_method
from pipeline_src.methods.vectorized import train_shards_vectorized
from tests.conftest import tiny_vit

pytestmark = pytest.mark.usefixtures("float64_default")
torch.set_num_threads(1)  # tiny tensors: extra threads only add sync cost on the shared 2-core box

CONFIGS = {
    "fc": {"kind": "fc"},
    "nlft": {"kind": "nlft", "k": 1},
    "nlft-cls": {"kind": "nlft", "k": 1, "reset_cls": True},  # CLS = T: the trained class token (search)
    "last": {"kind": "last", "rank": 4, "heads": 2, "every": 1, "modules_per_block": 2},
}
SETTINGS = {"epochs": 3, "batch_size": 5, "lr": 1e-2, "weight_decay": 1e-2,
            "schedule": {"name": "cosine", "warmup_epochs": 1, "min_factor": 0.1}}


def data(model, n: int = 40):
    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 5, (n,), generator=g)
    patterns = torch.randn(5, 1, 16, 16, generator=g, dtype=torch.float64)  # a learnable task
    x = 2.0 * patterns[y] + torch.randn(n, 1, 16, 16, generator=g, dtype=torch.float64)
    return model.prefix(x), y


@pytest.mark.parametrize("name", list(CONFIGS))
def test_vectorized_equals_separate(name: str) -> None:
    cfg = CONFIGS[name]
    backbone = tiny_vit(seed=0)
    model = build_tuned_model(backbone, cfg, 5, seed=1)
    feats, y = data(model)
    init = model.trainable_state()
    # Unequal shards: 13, 8 and 19 samples with batch 5 -> 3, 2 and 4 steps per epoch.
    shards = [(feats[a:b], y[a:b]) for a, b in [(0, 13), (13, 21), (21, 40)]]
    seeds = [7, 8, 9]
    settings = {**SETTINGS, "method": cfg}
    vec = train_shards_vectorized(model, cfg, shards, settings, seeds)
    for (f, lab), s, v in zip(shards, seeds, vec):
        alone = build_tuned_model(backbone, cfg, 5, seed=1)
        assert all(torch.equal(alone.trainable_state()[k], t) for k, t in init.items())  # the same init
        stats = get_method(cfg["kind"]).train(alone, f, lab, settings, s, "alone")
        assert stats["train_loss"] == pytest.approx(v["stats"]["train_loss"], rel=1e-9)
        state = alone.trainable_state()
        assert set(state) == set(v["state"])
        for k, t in state.items():
            assert torch.allclose(v["state"][k], t, rtol=1e-8, atol=1e-11), (name, k)
    # The shards learned different things, and they moved away from the init.
    some = next(k for k in init if k.endswith("weight"))
    assert not torch.allclose(vec[0]["state"][some], vec[1]["state"][some])
    assert not torch.allclose(vec[0]["state"][some], init[some])


def test_vectorized_refuses_taft_and_bad_seeds() -> None:
    backbone = tiny_vit(seed=0)
    taft = build_tuned_model(backbone, {"kind": "taft", "k": 1}, 5, seed=1)
    with pytest.raises(ValueError, match="taft"):
        train_shards_vectorized(taft, {"kind": "taft", "k": 1}, [], SETTINGS, [])
    fc = build_tuned_model(backbone, CONFIGS["fc"], 5, seed=1)
    feats, y = data(fc, 10)
    with pytest.raises(ValueError, match="2 seeds for 1 shards"):
        train_shards_vectorized(fc, CONFIGS["fc"], [(feats, y)], SETTINGS, [1, 2])
