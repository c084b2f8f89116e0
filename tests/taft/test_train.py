"""Training Δ from cached features; vectorized multi-shard training equals separate runs (float64)."""
from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.taft import TangentViT, train_tangent, train_tangent_vectorized

pytestmark = pytest.mark.usefixtures("float64_default")  # float64 for reference comparisons
torch.set_num_threads(1)  # tiny tensors: extra threads only add sync cost on the shared 2-core box
TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)


def setup(init_values=None, reset_cls: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    base = VisionTransformer(**TINY, qkv_bias=False, init_values=init_values).eval()
    model = TangentViT(base, 1, reset=True, reset_seed=1, reset_cls=reset_cls, delta_init_std=1e-3)
    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 5, (40,), generator=g)
    patterns = torch.randn(5, 1, 16, 16, generator=g)  # a learnable task: class-specific patterns
    x = 2.0 * patterns[y] + torch.randn(40, 1, 16, 16, generator=g)
    return base, model, model.prefix(x), y


def fresh(base, model) -> TangentViT:
    m = TangentViT(base, 1, reset=True, reset_seed=1, reset_cls=model.reset_cls, delta_init_std=1e-3)
    m.load_delta_state_dict(model.delta_state_dict())
    return m


def test_train_reduces_loss_and_only_delta_changes() -> None:
    base, model, feats, y = setup()
    prefix_before = {n: p.clone() for n, p in model.prefix_net.state_dict().items()}
    buffers_before = {n: b.clone() for n, b in model.named_buffers()}
    out = train_tangent(model, feats, y, epochs=5, batch_size=8, lr=2e-2, loss="rsl", kappa=5.0, seed=0)
    assert out["loss_history"][-1] < 0.5 * out["loss_history"][0]
    assert out["steps"] == 25 and out["n_samples"] == 40
    assert all(torch.equal(prefix_before[n], v) for n, v in model.prefix_net.state_dict().items())
    assert all(torch.equal(buffers_before[n], b) for n, b in model.named_buffers())


def test_seeded_training_is_reproducible_and_seed_matters() -> None:
    base, model, feats, y = setup()
    kw = dict(epochs=1, batch_size=8, lr=1e-2, loss="ce")
    a = train_tangent(fresh(base, model), feats, y, seed=5, **kw)["delta_state_dict"]
    b = train_tangent(fresh(base, model), feats, y, seed=5, **kw)["delta_state_dict"]
    c = train_tangent(fresh(base, model), feats, y, seed=6, **kw)["delta_state_dict"]
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.allclose(a[n], c[n]) for n in a)


def test_radius_projection_holds() -> None:
    base, model, feats, y = setup()
    train_tangent(model, feats, y, epochs=2, batch_size=8, lr=5e-2, loss="rsl", kappa=5.0, radius=0.1, seed=0)
    norm = torch.stack([p.square().sum() for p in model.delta_parameters()]).sum().sqrt()
    assert float(norm.detach()) <= 0.1 + 1e-12


@pytest.mark.parametrize("radius, wd, init_values, reset_cls", [(None, 1e-3, 0.2, True), (0.05, 0.0, None, False)])
def test_vectorized_equals_separate(radius, wd, init_values, reset_cls) -> None:
    base, model, feats, y = setup(init_values=init_values, reset_cls=reset_cls)
    # Unequal shards: 13, 8 and 19 samples with batch 5 -> 3, 2 and 4 steps per epoch.
    bounds = [(0, 13), (13, 21), (21, 40)]
    shards = [(feats[a:b], y[a:b]) for a, b in bounds]
    kw = dict(epochs=2, batch_size=5, lr=1e-2, weight_decay_l2=wd, loss="rsl", alpha=2.0, kappa=4.0,
              radius=radius)
    seeds = [7, 8, 9]
    vec = train_tangent_vectorized(model, shards, seed=seeds, **kw)
    for (f, lab), s, v in zip(shards, seeds, vec):
        sep = train_tangent(fresh(base, model), f, lab, seed=s, **kw)
        assert sep["steps"] == v["steps"]
        assert v["loss_history"] == pytest.approx(sep["loss_history"], rel=1e-9)
        for n, p in sep["delta_state_dict"].items():
            assert torch.allclose(v["delta_state_dict"][n], p, rtol=1e-8, atol=1e-11), n
    # The shards learned different things, and the template model was not modified.
    assert not torch.allclose(vec[0]["delta_state_dict"]["head.delta.weight"], vec[1]["delta_state_dict"]["head.delta.weight"])
    assert all(torch.equal(model.delta_state_dict()[n], p) for n, p in fresh(base, model).delta_state_dict().items())


def test_vectorized_rejects_bad_input() -> None:
    _, model, feats, y = setup()
    with pytest.raises(ValueError, match="seeds"):
        train_tangent_vectorized(model, [(feats, y)], seed=[1, 2], epochs=1, batch_size=4, lr=1e-3)
    with pytest.raises(ValueError, match="differ in length"):
        train_tangent_vectorized(model, [(feats, y[:3])], epochs=1, batch_size=4, lr=1e-3)
