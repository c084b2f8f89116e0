"""Book-keeping clipping (mode "bk", one backward pass) against the independent reference:
per-example gradients from micro-batches of size one, clipped to C and summed (float64),
for every method kind the DAG trains privately (nlft, taft, last) in every regime."""
from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pipeline_src.dp import (
    REGIMES,
    AdditiveDelta,
    BookKeepingModule,
    apply_regime,
    check_bk_supported,
    nlft_scope,
    train_private,
)
from pipeline_src.dp.parameter_use import ParameterUseError
from pipeline_src.methods.private import per_example_loss, select_trainable
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.vit.parts import FromPrefix
from tests.conftest import tiny_vit
from tests.dp.test_reference import ce, microbatch_grads

METHODS = {
    "nlft": {"kind": "nlft", "k": 1},
    "taft": {"kind": "taft", "k": 1},
    "taft-cls-jvp": {"kind": "taft", "k": 2, "reset_cls": True, "jvp_only": True, "loss": "ce"},
    "last": {"kind": "last", "rank": 4, "heads": 2},
}


def clipped_reference(model: nn.Module, x, y, c: float, loss_fn=ce):
    """(per-example grads, their norms, Opacus' clipping factors, clipped sums) from micro-batches."""
    per = microbatch_grads(model, x, y, loss_fn)
    flat = torch.cat([g.reshape(g.shape[0], -1) for g in per.values()], 1)
    norms = flat.norm(dim=1)
    coef = (c / (norms + 1e-6)).clamp(max=1.0)
    summed = {n: torch.einsum("b,b...->...", coef, g) for n, g in per.items()}
    return per, norms, coef, summed


def bk_step(model: nn.Module, x, y, c: float, loss_fn=ce) -> BookKeepingModule:
    bk = BookKeepingModule(model, max_grad_norm=c)
    try:
        bk.clipped_backward(loss_fn(bk(x), y))
    finally:
        bk.cleanup()
    return bk


def assert_bk_matches_reference(model: nn.Module, x, y, c: float, loss_fn=ce, expect_clipped: bool | None = None):
    per, norms, coef, summed = clipped_reference(model, x, y, c, loss_fn)
    if expect_clipped is not None:
        assert bool((norms > c).all()) == expect_clipped and bool((norms <= c).all()) != expect_clipped
    bk = bk_step(model, x, y, c, loss_fn)
    torch.testing.assert_close(bk.per_sample_gradient_norms, norms, rtol=1e-7, atol=0)
    params = dict(model.named_parameters())
    scale = max(float(s.abs().max()) for s in summed.values())
    assert scale > 1e-8
    for n, want in summed.items():
        got = params[n].grad
        assert got is not None and got.shape == want.shape, n
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-10 * scale, msg=n)
    # each example's contribution c_i ∇ℓ_i has norm ≤ C, and exactly C when clipped
    flat = torch.cat([g.reshape(g.shape[0], -1) for g in per.values()], 1)
    contrib = (bk.clipping_coef[:, None] * flat).norm(dim=1)
    assert (contrib <= c * (1 + 1e-9)).all()
    clipped = norms > c
    torch.testing.assert_close(contrib[clipped], torch.full_like(contrib[clipped], c), rtol=1e-5, atol=0)
    model.zero_grad(set_to_none=True)


def _perturb(model: nn.Module, scale: float = 0.05) -> None:
    """Move trainable parameters off their (often zero) init so every gradient is generic."""
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def dag_model(method: str, regime: str, backbone: VisionTransformer | None = None):
    """The DAG's DP setup (train_private step): tuned model, regime, FromPrefix view, prefix features, loss."""
    cfg = METHODS[method]
    model = build_tuned_model(backbone if backbone is not None else tiny_vit(train=True), cfg, num_classes=5, seed=0)
    model.requires_grad_(True)
    trained = select_trainable(model, cfg["kind"], regime, train_head=True)
    _perturb(model)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 1, 16, 16, dtype=torch.float64, generator=g)
    y = torch.randint(0, 5, (6,), generator=g)
    return FromPrefix(model), model.prefix(x), y, per_example_loss(cfg), trained


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("c,expect_clipped", [(1e-3, True), (1e4, False), (None, None)])
def test_bk_clipped_sum_matches_microbatches(method, regime, c, expect_clipped):
    view, h, y, loss_fn, trained = dag_model(method, regime)
    assert trained
    if c is None:  # C between the per-example norms: some examples clipped, some not
        norms = clipped_reference(view, h, y, 1.0, loss_fn)[1]
        c = float(norms.median())
    assert_bk_matches_reference(view, h, y, c, loss_fn, expect_clipped)


@pytest.mark.parametrize("method", ["nlft", "taft"])
def test_bk_layer_scale_backbone(method):
    """timm LayerScale (nlft) and TAFT's DeltaScale (its Δγ) are covered."""
    torch.manual_seed(0)
    backbone = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                                 num_heads=4, init_values=0.2).double()
    view, h, y, loss_fn, trained = dag_model(method, "full", backbone)
    assert any(n.endswith(("ls1.gamma", "ls1.delta.weight")) for n in trained), trained
    assert_bk_matches_reference(view, h, y, 0.05, loss_fn)


@pytest.mark.parametrize("regime", REGIMES)
def test_bk_nlft_from_images(regime):
    """The whole ViT on images, frozen prefix included (nothing upstream of the tail requires grad)."""
    model = tiny_vit(train=True)
    apply_regime(model, regime, nlft_scope(model))
    _perturb(model)
    x = torch.randn(5, 1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 5, (5,), generator=torch.Generator().manual_seed(2))
    assert_bk_matches_reference(model, x, y, 0.1)


@pytest.mark.parametrize("delta_shape", [(9, 8), (1, 8), (8,), (9, 1)])
def test_bk_additive_delta_vectors_and_embedding(delta_shape):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(4, 8, padding_idx=3)
            self.delta = AdditiveDelta(delta_shape, init_std=0.1)
            self.norm = nn.LayerNorm(8)
            self.lin = nn.Linear(8, 3)
            self.head = nn.Linear(27, 4)

        def forward(self, idx):
            h = self.delta(self.emb(idx))
            return self.head(self.lin(torch.tanh(self.norm(h))).flatten(1))

    torch.manual_seed(0)
    model = Net().double()
    idx = torch.randint(0, 4, (5, 9), generator=torch.Generator().manual_seed(3))  # repeated indices, padding
    y = torch.randint(0, 4, (5,))
    assert_bk_matches_reference(model, idx, y, 0.5)


def test_bk_direct_linear_form_and_vectors():
    """Narrow Linear on tokens takes the direct form; (B, d) inputs the vector form."""
    torch.manual_seed(0)
    tok = nn.Sequential(nn.Linear(6, 2), nn.Tanh(), nn.Linear(2, 3), nn.Flatten(), nn.Linear(30, 4)).double()
    assert_bk_matches_reference(tok, torch.randn(7, 10, 6, dtype=torch.float64), torch.randint(0, 4, (7,)), 0.3)
    vec = nn.Sequential(nn.Linear(6, 10), nn.LayerNorm(10), nn.Tanh(), nn.Linear(10, 3)).double()
    assert_bk_matches_reference(vec, torch.randn(7, 6, dtype=torch.float64), torch.randint(0, 3, (7,)), 0.3)


def test_bk_skips_parameter_gradients_and_unused_params_get_zero():
    """One backward to the layer outputs: frozen flags restored, a trainable module that the
    forward never used gets a zero clipped sum."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.unused = nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            return self.a(x)

    def graph_leaves(fn, seen=None) -> set:
        seen = set() if seen is None else seen
        out = set()
        for nxt, _ in (fn.next_functions if fn is not None else ()):
            if nxt is None or nxt in seen:
                continue
            seen.add(nxt)
            if hasattr(nxt, "variable"):
                out.add(nxt.variable)
            out |= graph_leaves(nxt, seen)
        return out

    model = Net().double()
    bk = BookKeepingModule(model, max_grad_norm=1.0)
    # the first step is probed (`first_step_probe`): its forward keeps the parameters in the graph
    first = bk(torch.randn(5, 4, dtype=torch.float64))
    assert any(leaf is model.a.weight for leaf in graph_leaves(first.grad_fn))
    bk.clipped_backward(ce(first, torch.randint(0, 3, (5,))))
    assert bk.probe.runs == 1 and not bk.probe.armed
    model.zero_grad(set_to_none=True)
    out = bk(torch.randn(5, 4, dtype=torch.float64))
    assert all(p.requires_grad for p in model.parameters())
    leaves = graph_leaves(out.grad_fn)  # only BK's anchor: no parameter is in the autograd graph
    assert len(leaves) == 1 and not any(leaf is p for leaf in leaves for p in model.parameters())
    bk.clipped_backward(ce(out, torch.randint(0, 3, (5,))))
    assert torch.equal(model.unused.weight.grad, torch.zeros(3, 4, dtype=torch.float64))
    assert model.a.weight.grad.abs().max() > 0
    bk.cleanup()
    assert not model.a._forward_hooks


def test_bk_uncovered_module_raises_naming_it():
    model = tiny_vit(train=True)
    apply_regime(model, "full", nlft_scope(model))
    model.cls_token.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="VisionTransformer.*'<root>'.*cls_token"):
        check_bk_supported(model)
    model.cls_token.requires_grad_(False)
    model.patch_embed.proj.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="Conv2d.*patch_embed.proj"):
        BookKeepingModule(model, max_grad_norm=1.0)
    x = torch.randn(20, 1, 16, 16, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="Conv2d"):
        train_private(model, x, torch.zeros(20, dtype=torch.long), epochs=1, batch_size=5, lr=0.1, epsilon=2.0,
                      delta=1e-3, max_grad_norm=1.0, mode="bk")
    from timm.layers import LayerScale

    with pytest.raises(NotImplementedError, match="in-place"):
        check_bk_supported(LayerScale(4, inplace=True))
    with pytest.raises(NotImplementedError, match="Embedding 'emb'.*max_norm"):
        check_bk_supported(nn.ModuleDict({"emb": nn.Embedding(3, 2, max_norm=1.0)}))


def test_bk_tied_module_raises():
    lin = nn.Linear(3, 3).double()
    bk = BookKeepingModule(nn.Sequential(lin, nn.Tanh(), lin), max_grad_norm=1.0)
    with pytest.raises(RuntimeError, match="ran twice"):
        bk(torch.randn(2, 3, dtype=torch.float64))
    assert lin.weight.requires_grad  # flags restored after the failed forward
    bk.cleanup()


def test_bk_rule_registration_and_incomplete_rule():
    from pipeline_src.dp import BK_RULES, register_bk_rule

    def other(layer, activations, backprops):
        return {}, lambda coef: {}

    with pytest.raises(ValueError, match="already registered"):
        register_bk_rule(nn.Linear)(other)

    class Scale2(nn.Module):  # two parameters; its rule below forgets `b`
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.ones(3, dtype=torch.float64)), nn.Parameter(torch.zeros(3, dtype=torch.float64))

        def forward(self, x):
            return x * self.w + self.b

    @register_bk_rule(Scale2)
    def scale2_bk(layer, activations, backprops):
        gs = (activations[0] * backprops)
        return {layer.w: gs.pow(2).sum(1)}, lambda coef: {layer.w: coef @ gs}

    try:
        bk = BookKeepingModule(Scale2(), max_grad_norm=1.0)
        out = bk(torch.randn(4, 3, dtype=torch.float64))
        # the first step's probe sees that the rule rebuilds no gradient for `b`; later steps, the count
        with pytest.raises(ParameterUseError, match="rebuilt-gradient check: .* parameter 'b' rebuilt"):
            bk.clipped_backward(out.sum(1))
        out = bk(torch.randn(4, 3, dtype=torch.float64))
        with pytest.raises(RuntimeError, match="scale2_bk.*covered 1 of its 2"):
            bk.clipped_backward(out.sum(1))
    finally:
        del BK_RULES[Scale2]
