"""∇_Δw through the primal network (`primal_gradient`) equals autograd through the tangent ops,
in float64, on every supported layout; and leaves the model as it was."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.taft import TangentViT
from pipeline_src.taft.jvp_layers import primal_grad_enabled
from pipeline_src.taft.losses import delta_l2_penalty, get_loss
from pipeline_src.taft.primal_gradient import primal_gradient, primal_gradient_backward
from pipeline_src.taft.train import stacked_gradients, tangent_step
from tests.taft.test_backbones import FAMILIES, images_for, make
from tests.taft.test_model import CONFIGS, images, make_base, rel_err

pytestmark = pytest.mark.usefixtures("float64_default")  # float64 for reference comparisons
torch.set_num_threads(1)


def both_gradients(model: TangentViT, x: torch.Tensor, loss: str = "rsl") -> tuple[dict, dict]:
    """(∇ by autograd through the tangent ops, ∇ through the primal network) of the same loss."""
    labels = torch.arange(x.shape[0]) % 5
    loss_fn = get_loss(loss, *((1.5, 3.0) if loss == "rsl" else ()))
    feats = model.prefix(x)

    def loss_of() -> torch.Tensor:
        return loss_fn(model.forward_from_prefix(feats), labels)

    model.zero_grad(set_to_none=True)
    loss_of().backward()
    ref = {n: p.grad.clone() for n, p in model.named_delta_parameters()}
    model.zero_grad(set_to_none=True)
    primal_gradient_backward(model, loss_of)
    got = {n: p.grad.clone() for n, p in model.named_delta_parameters()}
    return ref, got


def assert_same(ref: dict, got: dict) -> None:
    assert set(ref) == set(got)
    scale = torch.sqrt(sum(g.square().sum() for g in ref.values()))
    for n in ref:
        # relative to the whole gradient: k_norm's Δβ has an exactly zero gradient (a shift of
        # every key leaves the softmax unchanged), so its own norm is rounding noise.
        assert float((got[n] - ref[n]).norm() / scale) < 1e-12, n
    nonzero = sum(bool(g.abs().max() > 1e-8 * scale) for g in ref.values())
    assert nonzero >= 0.9 * len(ref)  # a real comparison, not of zeros


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_equals_autograd_through_the_tangent(cfg: str, k: int) -> None:
    model = TangentViT(make_base(**CONFIGS[cfg]), k, delta_init_std=0.05)
    assert_same(*both_gradients(model, images(4)))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_equals_autograd_on_timm_families(family: str) -> None:
    base = make(family)
    model = TangentViT(base, 2, delta_init_std=0.05)
    assert_same(*both_gradients(model, images_for(base, 4), loss="ce"))


@pytest.mark.parametrize("jvp_only", [False, True])
def test_reset_cls_and_jvp_only(jvp_only: bool) -> None:
    model = TangentViT(make_base(), 1, reset=True, reset_seed=2, reset_cls=True, jvp_only=jvp_only,
                       delta_init_std=0.05)
    ref, got = both_gradients(model, images(4), loss="ce")
    assert "cls_delta.weight" in got
    assert_same(ref, got)


def test_context_restores_the_model_and_the_mode() -> None:
    model = TangentViT(make_base(), 2, delta_init_std=0.05)
    before = {n: b.clone() for n, b in model.named_buffers()}
    with pytest.raises(RuntimeError, match="boom"):
        with primal_gradient(model):
            assert primal_grad_enabled()
            raise RuntimeError("boom")
    assert not primal_grad_enabled()
    assert not any(b.requires_grad for b in model.buffers())
    assert all(torch.equal(before[n], b) for n, b in model.named_buffers())
    # Outside the context the tangent keeps its graph (DP needs the Δ modules on the autograd path).
    assert model(images()).requires_grad


def test_tangent_step_same_update_either_way() -> None:
    base = make_base(init_values=0.3)
    feats_x, labels = images(6), torch.arange(6) % 5
    out = []
    for through_primal in (True, False):
        model = TangentViT(base, 2, delta_init_std=0.05)
        opt = torch.optim.AdamW(model.delta_parameters(), lr=1e-2, weight_decay=0.0)
        feats = model.prefix(feats_x)
        losses = [tangent_step(model, opt, feats, labels, get_loss("rsl"), 1e-3, radius=5.0,
                               through_primal=through_primal) for _ in range(3)]
        out.append((losses, model.delta_state_dict()))
    (l1, s1), (l2, s2) = out
    assert l1 == pytest.approx(l2, rel=1e-12)
    assert all(rel_err(s1[n], s2[n]) < 1e-10 for n in s1)


@pytest.mark.parametrize("family", ["qk_norm_no_bias_layer_scale", "clip_quickgelu", "deit_distilled"])
def test_no_tangent_graph_inside_the_context(family: str) -> None:
    # The gradient would be right even with a tangent graph (it never reaches the loss), so check
    # the cost directly: inside the context no layer's tangent output records autograd history.
    base = make(family)
    model = TangentViT(base, 2, reset_cls=True, delta_init_std=0.05)
    seen = []

    def hook(module, args, out) -> None:
        if isinstance(out, tuple) and len(out) == 2:
            seen.append(type(module).__name__)
            assert out[0].requires_grad, type(module).__name__
            assert out[1] is None or not out[1].requires_grad, type(module).__name__

    handles = [m.register_forward_hook(hook) for m in model.modules() if m is not model]
    with primal_gradient(model):
        model(images_for(base))
    for h in handles:
        h.remove()
    assert {"TangentLinear", "TangentLayerNorm", "TangentAttention", "TangentBlock"} <= set(seen)


@pytest.mark.parametrize("k", [1, 2])
def test_no_grad_forward_equals_the_recorded_one(k: int) -> None:
    # Without a graph the tangent GEMMs accumulate in place (TangentLinear): same values.
    model = TangentViT(make_base(init_values=0.3), k, reset_cls=True, delta_init_std=0.05)
    x = images()
    recorded = model(x)
    assert recorded.requires_grad
    with torch.no_grad():
        assert rel_err(model(x), recorded) < 1e-14
    with primal_gradient(model):
        assert rel_err(model(x), recorded) < 1e-14


@pytest.mark.parametrize("family", ["qk_norm_no_bias_layer_scale", "deit_distilled", "clip_quickgelu_avg"])
def test_vectorized_gradients_through_the_primal(family: str) -> None:
    # Two shards, each with its own Δ and batch (the second padded), against autograd through
    # the tangent ops, vectorized and shard by shard.
    base = make(family)
    model = TangentViT(base, 2, reset_cls=family == "deit_distilled", delta_init_std=0.05)
    loss_fn, wd = get_loss("rsl", 1.0, 3.0), 1e-2
    g = torch.Generator().manual_seed(4)
    named = model.named_delta_parameters()
    params = {f"tuned.{n}": p.detach() + 0.05 * torch.randn((2, *p.shape), generator=g) for n, p in named}
    h = torch.stack([model.prefix(images_for(base, 4)), model.prefix(2 * images_for(base, 4))])
    y = torch.tensor([[0, 1, 2, 3], [4, 0, 1, 0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    got, loss_got = stacked_gradients(model, loss_fn, wd, through_primal=True)(params, h, y, mask)
    ref, loss_ref = stacked_gradients(model, loss_fn, wd, through_primal=False)(params, h, y, mask)
    assert torch.allclose(loss_got, loss_ref, rtol=1e-12)
    for s in range(2):
        assert_same({n: ref[n][s] for n in ref}, {n: got[n][s] for n in got})
        # and shard s alone, through `tangent_step`'s autograd path
        model.load_delta_state_dict({n[len("tuned."):]: p[s] for n, p in params.items()})
        keep = mask[s] > 0
        model.zero_grad(set_to_none=True)
        (loss_fn(model.forward_from_prefix(h[s][keep]), y[s][keep]) + wd * delta_l2_penalty(model)).backward()
        assert_same({n: p.grad for n, p in model.named_delta_parameters()},
                    {n[len("tuned."):]: got[n][s] for n in got})


@pytest.mark.parametrize("through_primal", [True, False])
def test_the_l2_penalty_gradient_equals_autograd_through_the_penalty(through_primal: bool) -> None:
    # tangent_step adds 2·λ·Δ to the data gradient directly (`add_l2_penalty_gradient_`); the
    # reference puts λ·‖Δ‖² in the loss and backpropagates through it.
    model = TangentViT(make_base(init_values=0.3), 2, delta_init_std=0.05)
    feats, labels, wd = model.prefix(images(6)), torch.arange(6) % 5, 0.5
    loss_fn = get_loss("rsl")
    model.zero_grad(set_to_none=True)
    ref_loss = loss_fn(model.forward_from_prefix(feats), labels) + wd * delta_l2_penalty(model)
    ref_loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_delta_parameters()}
    opt = torch.optim.SGD(model.delta_parameters(), lr=0.0)  # the step leaves Δ and its .grad
    loss = tangent_step(model, opt, feats, labels, loss_fn, wd, through_primal=through_primal)
    assert loss == pytest.approx(float(ref_loss), rel=1e-12)
    assert_same(ref, {n: p.grad for n, p in model.named_delta_parameters()})
