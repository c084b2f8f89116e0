"""Composition equals ensembling, removal equals composing the rest; losses and Δ regularizers."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.taft import (
    TangentViT,
    check_same_linearization,
    compose_deltas,
    delta_l2_penalty,
    get_loss,
    project_to_ball,
    remaining_weights,
    subtract_component,
    train_tangent,
)

pytestmark = pytest.mark.usefixtures("float64_default")  # float64 for reference comparisons
torch.set_num_threads(1)  # tiny tensors: extra threads only add sync cost on the shared 2-core box
TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp(min=1e-30))


@pytest.fixture(scope="module")
def trained():
    """Three shard models trained from one base (reset head, k=1), plus test images."""
    torch.manual_seed(0)
    base = VisionTransformer(**TINY).eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(36, 1, 16, 16, generator=g)
    y = torch.randint(0, 5, (36,), generator=g)
    model = TangentViT(base, 1, reset=True, reset_seed=4)
    feats = model.prefix(x)
    sds, ids = [], []
    for s in range(3):
        m = TangentViT(base, 1, reset=True, reset_seed=4)
        sl = slice(12 * s, 12 * (s + 1))
        out = train_tangent(m, feats[sl], y[sl], epochs=2, batch_size=4, lr=1e-2, weight_decay_l2=1e-4,
                            loss="rsl", kappa=5.0, seed=s)
        sds.append(out["delta_state_dict"])
        ids.append(m.linearization_id())
    return model, sds, ids, torch.randn(5, 1, 16, 16, generator=g)


def logits(model: TangentViT, sd: dict, x: torch.Tensor) -> torch.Tensor:
    model.load_delta_state_dict(sd)
    return model(x).detach()


def test_composition_equals_ensemble(trained) -> None:
    model, sds, ids, x = trained
    check_same_linearization(ids)
    w = [0.5, 0.2, 0.3]
    ensemble = sum(wi * logits(model, sd, x) for wi, sd in zip(w, sds))
    assert rel_err(logits(model, compose_deltas(sds, w), x), ensemble) < 1e-10
    # The models really differ, so the identity is not trivial.
    assert rel_err(logits(model, sds[0], x), logits(model, sds[1], x)) > 1e-3


def test_subtraction_equals_composing_the_rest(trained) -> None:
    model, sds, _, x = trained
    w = [1 / 3] * 3
    composed = compose_deltas(sds, w)
    removed = subtract_component(composed, sds[1], w, index=1)
    rest = compose_deltas([sds[0], sds[2]], remaining_weights(w, 1))
    assert remaining_weights(w, 1) == pytest.approx([0.5, 0.5])
    assert all(rel_err(removed[n], rest[n]) < 1e-12 for n in rest)
    ens = 0.5 * (logits(model, sds[0], x) + logits(model, sds[2], x))
    assert rel_err(logits(model, removed, x), ens) < 1e-10
    raw = subtract_component(composed, sds[1], w, index=1, renormalize=False)
    assert all(rel_err(raw[n], composed[n] - sds[1][n] / 3) < 1e-12 for n in raw)


def test_mismatched_linearization_and_keys_raise(trained) -> None:
    _, sds, ids, _ = trained
    with pytest.raises(ValueError, match="different linearization"):
        check_same_linearization([ids[0], ids[1], "0" * 64])
    with pytest.raises(ValueError, match="differs in keys"):
        compose_deltas([sds[0], {n: v for n, v in sds[1].items() if "head" not in n}], [0.5, 0.5])
    with pytest.raises(ValueError, match="weights"):
        compose_deltas(sds, [1.0])
    with pytest.raises(ValueError, match="sum to zero"):
        subtract_component(sds[0], sds[0], [1.0], index=0)


def test_rescaled_square_loss_matches_definition() -> None:
    g = torch.Generator().manual_seed(0)
    f = torch.randn(4, 6, generator=g)
    y = torch.tensor([0, 3, 5, 2])
    alpha, kappa = 3.0, 15.0
    expected = torch.stack([
        (alpha * (f[b, y[b]] - kappa) ** 2 + sum(f[b, i] ** 2 for i in range(6) if i != y[b])) / 6
        for b in range(4)])
    rsl = get_loss("rsl", alpha, kappa)
    assert rel_err(rsl(f, y, reduction="none"), expected) < 1e-14
    assert float(rsl(f, y)) == pytest.approx(float(expected.mean()), rel=1e-14)
    mse = get_loss("mse")(f, y)
    assert float(mse) == pytest.approx(float(F.mse_loss(f, F.one_hot(y, 6).double())), rel=1e-14)
    assert float(get_loss("ce")(f, y)) == pytest.approx(float(F.cross_entropy(f, y)), rel=1e-14)
    with pytest.raises(ValueError, match="alpha"):
        get_loss("ce", alpha=2.0)
    with pytest.raises(KeyError, match="unknown loss"):
        get_loss("hinge")


def test_penalty_and_projection() -> None:
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])
    assert float(delta_l2_penalty([a, b])) == pytest.approx(25.0)
    assert float(delta_l2_penalty([a, b], squared=False)) == pytest.approx(5.0)
    assert project_to_ball([a, b], 10.0) == pytest.approx(5.0) and float(a[0]) == 3.0
    project_to_ball([a, b], 1.0)
    assert float(delta_l2_penalty([a, b])) == pytest.approx(1.0)
    assert rel_err(torch.cat([a, b.flatten()]), torch.tensor([0.6, 0.0, 0.8])) < 1e-14
    with pytest.raises(ValueError, match="radius"):
        project_to_ball([a], 0.0)


def test_size_weighted_soup_equals_the_size_weighted_ensemble_in_float32(trained) -> None:
    """`compose_weights: size`: the evaluated ensemble takes the soup's weights, so the two
    rows agree (the plain mean of logits differed whenever shard sizes differed)."""
    from pipeline_src.methods.composition import composition_weights, ensemble_logits

    model, sds, ids, x = trained
    model, x = copy.deepcopy(model).float(), x.float()  # the fixture's model stays float64
    sds = [{k: v.float() for k, v in sd.items()} for sd in sds]
    weights = composition_weights([{"num_samples": n} for n in (257, 243, 300)], "size")
    soup = logits(model, compose_deltas(sds, weights), x)
    members = [logits(model, sd, x) for sd in sds]
    assert (soup - ensemble_logits(members, weights)).abs().max() <= 1e-6 * soup.abs().max()
    assert (soup - ensemble_logits(members)).abs().max() > 1e-4 * soup.abs().max()  # the plain mean is another model
