"""TangentViT vs torch.func.jvp of the timm ViT w.r.t. the linearized parameters (float64)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from timm.models.vision_transformer import ResPostBlock, VisionTransformer
from torch.func import functional_call, jvp

from pipeline_src.taft import TangentViT

pytestmark = pytest.mark.usefixtures("float64_default")  # float64 for reference comparisons
torch.set_num_threads(1)  # tiny tensors: extra threads only add sync cost on the shared 2-core box
TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)
CONFIGS = {
    "cls": dict(),
    "no_qkv_bias": dict(qkv_bias=False),
    "avg_fc_norm": dict(global_pool="avg", class_token=False),  # fc_norm defaults on for avg
    "avg_final_norm": dict(global_pool="avg", fc_norm=False),
    "layer_scale": dict(init_values=0.3),
    "reg_tokens": dict(reg_tokens=2, global_pool="avg", no_embed_class=True),
    "gelu_tanh": dict(act_layer="gelu_tanh"),
}


def make_base(seed: int = 0, **kw) -> VisionTransformer:
    torch.manual_seed(seed)
    base = VisionTransformer(**{**TINY, **kw}).eval()
    with torch.no_grad():  # move LayerNorms and the head off their trivial init
        for n, p in base.named_parameters():
            if "norm" in n or "head" in n:
                p.add_(0.2 * torch.randn_like(p))
    return base


def images(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 1, 16, 16, generator=torch.Generator().manual_seed(seed))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp(min=1e-30))


class _Reference(nn.Module):
    """timm forward, optionally with the class-token row of the k-th-from-last block input replaced."""

    def __init__(self, base: VisionTransformer, k: int) -> None:
        super().__init__()
        self.base, self.k = base, k
        for blk in base.blocks:
            blk.attn.fused_attn = False  # forward-mode AD cannot go through fused SDPA

    def forward(self, x: torch.Tensor, cls_input: torch.Tensor | None = None) -> torch.Tensor:
        b = self.base
        h = b.norm_pre(b.patch_drop(b._pos_embed(b.patch_embed(x))))
        split = len(b.blocks) - self.k
        for blk in b.blocks[:split]:
            h = blk(h)
        if cls_input is not None:
            h = torch.cat([cls_input.expand(h.shape[0], 1, -1), h[:, 1:]], dim=1)
        for blk in b.blocks[split:]:
            h = blk(h)
        return b.forward_head(b.norm(h))


def reference(base: VisionTransformer, model: TangentViT, x: torch.Tensor):
    """(f_w(x), J·Δ) by torch.func.jvp w.r.t. exactly the parameters TangentViT linearizes."""
    ref = _Reference(base, model.k)
    pairs = model.linearization_pairs()
    cls = pairs.pop("cls_input", None)
    names = [f"base.{n}" for n in pairs]

    def f(*vals):
        if cls is not None:
            *vals, c = vals
            return functional_call(ref, dict(zip(names, vals)), (x, c))
        return functional_call(ref, dict(zip(names, vals)), (x,))

    primals = [w for w, _ in pairs.values()] + ([cls[0]] if cls else [])
    tangents = [d.detach() for _, d in pairs.values()] + ([cls[1].detach()] if cls else [])
    return jvp(f, tuple(primals), tuple(tangents))


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_matches_torch_func_jvp(cfg: str, k: int) -> None:
    base = make_base(**CONFIGS[cfg])
    model = TangentViT(base, k, delta_init_std=0.05)
    x = images()
    y_ref, jdw_ref = reference(base, model, x)
    assert rel_err(model(x), y_ref + jdw_ref) < 1e-6
    assert rel_err(TangentViT(base, k, jvp_only=True, delta_init_std=0.05)(x), jdw_ref) < 1e-6


@pytest.mark.parametrize("k", [1, 2])
def test_reset_and_reset_cls_match_jvp(k: int) -> None:
    base = make_base()
    model = TangentViT(base, k, reset=True, reset_seed=3, reset_cls=True, delta_init_std=0.05)
    # The reference linearizes the timm net around the reset weights held by the model.
    reset_base = make_base()
    with torch.no_grad():
        for name, (w, _) in model.linearization_pairs().items():
            if name != "cls_input":
                reset_base.get_parameter(name).copy_(w)
    x = images()
    y_ref, jdw_ref = reference(reset_base, model, x)
    assert rel_err(model(x), y_ref + jdw_ref) < 1e-6


def test_zero_delta_equals_base_and_prefix_caching() -> None:
    for cfg in CONFIGS.values():
        base = make_base(**cfg)
        x = images()
        for k in (1, 2):
            model = TangentViT(base, k)
            assert rel_err(model(x), base(x)) < 1e-12
            assert rel_err(model.forward_from_prefix(model.prefix(x)), base(x)) < 1e-12
            assert model.prefix(x).shape == (3, base.patch_embed.num_patches + base.num_prefix_tokens, 32)


def test_linear_in_delta() -> None:
    base = make_base(init_values=0.3)
    x = images()
    model = TangentViT(base, 2, jvp_only=True)
    g = torch.Generator().manual_seed(5)
    d1 = {n: torch.randn(p.shape, generator=g) for n, p in model.delta_state_dict().items()}
    d2 = {n: torch.randn(p.shape, generator=g) for n, p in model.delta_state_dict().items()}

    def out(sd):
        model.load_delta_state_dict(sd)
        return model(x)

    combo = {n: 2.0 * d1[n] - 0.5 * d2[n] for n in d1}
    assert rel_err(out(combo), 2.0 * out(d1) - 0.5 * out(d2)) < 1e-10


def test_reset_is_deterministic_and_changes_the_point() -> None:
    base = make_base()
    a = TangentViT(base, 1, reset=True, reset_seed=11, reset_cls=True)
    b = TangentViT(make_base(), 1, reset=True, reset_seed=11, reset_cls=True)
    c = TangentViT(base, 1, reset=True, reset_seed=12, reset_cls=True)
    plain = TangentViT(base, 1)
    pa, pb = a.linearization_pairs(), b.linearization_pairs()
    assert all(torch.equal(pa[n][0], pb[n][0]) for n in pa)
    assert a.linearization_id() == b.linearization_id()
    assert len({a.linearization_id(), c.linearization_id(), plain.linearization_id()}) == 3
    assert not torch.equal(pa["head.weight"][0], base.head.weight)
    # The frozen prefix is part of the point too.
    assert TangentViT(make_base(seed=1), 1).linearization_id() != plain.linearization_id()


def test_parameters_state_dict_and_base_untouched() -> None:
    base = make_base(init_values=0.3)
    before = {n: p.clone() for n, p in base.state_dict().items()}
    model = TangentViT(base, 1, delta_init_std=0.1)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == [n for n, _ in model.named_delta_parameters()]
    assert all(".delta." in n for n in trainable)
    sd = model.delta_state_dict()
    other = TangentViT(base, 1)
    other.load_delta_state_dict(sd)
    assert rel_err(other(images()), model(images())) < 1e-14
    with pytest.raises(KeyError, match="missing"):
        other.load_delta_state_dict({n: v for n, v in sd.items() if "head" not in n})
    assert all(torch.equal(before[n], v) for n, v in base.state_dict().items())
    assert all(p.requires_grad for p in base.parameters())


def test_each_delta_module_called_once() -> None:
    model = TangentViT(make_base(init_values=0.3), 2, reset_cls=True)
    calls: dict[str, int] = {}
    owners = [n for n, m in model.named_modules()
              if any(p.requires_grad for p in m.parameters(recurse=False))]
    for n in owners:
        model.get_submodule(n).register_forward_hook(
            lambda mod, i, o, n=n: calls.__setitem__(n, calls.get(n, 0) + 1))
    model(images())
    assert calls == {n: 1 for n in owners} and "cls_delta" in calls


@pytest.mark.parametrize("kw, k, match", [
    (dict(), 0, "k must be"),
    (dict(), 3, "k must be"),
    (dict(qk_norm=True, scale_attn_norm=True), 1, "scale_attn_norm"),  # LayerNorm qk_norm alone is supported
    (dict(act_layer="relu"), 1, "ReLU"),
    (dict(global_pool="map"), 1, "attn_pool"),
    (dict(global_pool="max"), 1, "global_pool"),
    (dict(block_fn=ResPostBlock), 1, "ResPostBlock"),
    (dict(scale_mlp_norm=True), 1, "mlp.norm"),
    (dict(num_classes=0), 1, "head"),
    (dict(global_pool="avg", class_token=False), 1, "reset_cls"),
])
def test_unsupported_options_raise(kw: dict, k: int, match: str) -> None:
    base = make_base(**kw)
    with pytest.raises((TypeError, ValueError), match=match):
        TangentViT(base, k, reset_cls="reset_cls" in match)


def test_dropout_in_train_mode_raises() -> None:
    model = TangentViT(make_base(drop_rate=0.1, proj_drop_rate=0.1), 1)
    model.eval()(images())
    with pytest.raises(RuntimeError, match="dropout"):
        model.train()(images())


@pytest.mark.parametrize("cfg", ["cls", "layer_scale", "avg_fc_norm"])
def test_backward_is_the_adjoint_of_the_jvp(cfg: str) -> None:
    # The JVP output c·(J v) is linear in Δ = v, so autograd must give ∇_Δ = Jᵀc with
    # <Jᵀc, v> = c·(J v) for any v: a check of every backward formula that needs no autograd reference.
    base = make_base(**CONFIGS[cfg])
    model = TangentViT(base, 2, jvp_only=True, reset_cls=cfg == "cls")
    x = images()
    c = torch.randn(3, 5, generator=torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(10)
    v = {n: torch.randn(p.shape, generator=g) for n, p in model.delta_state_dict().items()}
    model.zero_grad()
    (c * model(x)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_delta_parameters()}
    model.load_delta_state_dict(v)
    forward = float((c * model(x)).sum())
    adjoint = float(sum((grads[n] * v[n]).sum() for n in v))
    assert adjoint == pytest.approx(forward, rel=1e-10)


@pytest.mark.parametrize("change", ["gelu_tanh", "ln_eps", "attn_scale"])
def test_same_weights_under_another_architecture_config_get_another_linearization_id(change) -> None:
    """Equal weights, another function (outputs differed by 1.6e-4, 2.3e-3 and 7.0e-2): not one
    linearization point."""
    from functools import partial

    from timm.layers import GELUTanh

    base = make_base()
    kw = {"gelu_tanh": {"act_layer": GELUTanh}, "ln_eps": {"norm_layer": partial(nn.LayerNorm, eps=1e-3)},
          "attn_scale": {}}[change]
    other = make_base(**kw)
    other.load_state_dict(base.state_dict())
    for blk in [*base.blocks, *other.blocks]:
        blk.attn.fused_attn = False  # timm's fused path ignores `scale`; TAFT's attention reads it
    if change == "attn_scale":
        for blk in other.blocks:
            blk.attn.scale = 0.5 * blk.attn.scale
    with torch.no_grad():
        assert not torch.allclose(other(images()), base(images()), rtol=0, atol=1e-7)  # another function
    a, b = TangentViT(base, 1), TangentViT(other, 1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert a.linearization_id() != b.linearization_id()
    assert TangentViT(make_base(), 1).linearization_id() == a.linearization_id()  # and stays stable


class _TokenBatchNorm(nn.Module):
    """BatchNorm over the embedding dim of (B, N, D) tokens: a BatchNorm stem in the frozen prefix."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(d, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x.transpose(1, 2)).transpose(1, 2)


def test_train_keeps_the_frozen_prefix_in_eval_mode() -> None:
    """A BatchNorm stem stays at its running statistics under `.train()`: the linearization point
    does not move (it did: the batch's statistics and updated running stats)."""
    torch.manual_seed(0)
    base = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                             num_heads=4).double()
    base.norm_pre = _TokenBatchNorm(32)
    with torch.no_grad():
        base.norm_pre.bn.running_mean.uniform_(-1, 1)
        base.norm_pre.bn.running_var.uniform_(0.5, 2)
    model = TangentViT(base.eval(), k=1)
    x = torch.randn(4, 1, 16, 16, dtype=torch.float64)
    ident = model.linearization_id()
    with torch.no_grad():
        expected = model.eval()(x)
        got = model.train()(x)
    assert model.training and model.blocks.training and not any(m.training for m in model.prefix_net.modules())
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the same ops on the same values
    assert model.linearization_id() == ident
