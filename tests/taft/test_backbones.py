"""TangentViT on the timm families people fine-tune, vs torch.func.jvp in float64: DeiT
distilled, OpenAI/OpenCLIP (QuickGELU, pre_norm), qk_norm; refusals for the others; DP-TAFT
per-example norms of the new Δ modules vs micro-batches of size one."""
from __future__ import annotations

from functools import partial

import pytest
import timm
import torch
import torch.nn as nn
from timm.layers import LayerNorm, RmsNorm, SwiGLU, SwiGLUPacked
from timm.layers.activations import quick_gelu
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.dp import check_fast_supported
from pipeline_src.taft import TangentViT
from pipeline_src.taft.jvp_layers import TangentQuickGELU, quick_gelu_jvp
from tests.dp.test_reference import assert_norms_match
from tests.taft.test_model import images, reference, rel_err

pytestmark = pytest.mark.usefixtures("float64_default")  # float64 for reference comparisons
torch.set_num_threads(1)
TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)
CLIP = dict(pre_norm=True, norm_layer=partial(LayerNorm, eps=1e-5))  # timm's vit_*_clip_* towers
# name -> (model class, kwargs) of each family, tiny
FAMILIES = {
    "deit_distilled": (VisionTransformerDistilled, dict()),
    "deit_distilled_layer_scale": (VisionTransformerDistilled, dict(init_values=0.3, qkv_bias=False)),
    "clip_quickgelu": (VisionTransformer, dict(CLIP, act_layer="quick_gelu")),
    "clip_quickgelu_avg": (VisionTransformer, dict(CLIP, act_layer="quick_gelu", global_pool="avg")),
    "clip_gelu_pre_norm": (VisionTransformer, dict(CLIP)),
    "qk_norm": (VisionTransformer, dict(qk_norm=True)),
    "qk_norm_no_bias_layer_scale": (VisionTransformer, dict(qk_norm=True, qkv_bias=False, init_values=0.3)),
    "qk_norm_reg_avg": (VisionTransformer, dict(qk_norm=True, reg_tokens=2, global_pool="avg", no_embed_class=True)),
}


def make(family: str, seed: int = 0) -> VisionTransformer:
    cls, kw = FAMILIES[family]
    torch.manual_seed(seed)
    return perturbed(cls(**{**TINY, **kw}), seed)


def perturbed(base: nn.Module, seed: int = 0) -> nn.Module:
    """Move norms, heads and the distillation token off their trivial init (a q/k LayerNorm at
    γ = 1, β = 0 would hide a wrong Δγ/Δβ wiring)."""
    g = torch.Generator().manual_seed(seed + 100)
    base = base.double().eval()
    with torch.no_grad():
        for n, p in base.named_parameters():
            if "norm" in n or "head" in n or "dist_token" in n:
                p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return base


def images_for(base: nn.Module, n: int = 3) -> torch.Tensor:
    c, s = base.patch_embed.proj.in_channels, base.patch_embed.img_size[0]
    return torch.randn(n, c, s, s, generator=torch.Generator().manual_seed(1))


# ---- closed forms ------------------------------------------------------------------------
def test_quick_gelu_jvp_matches_autodiff() -> None:
    x = torch.cat([torch.linspace(-12, 12, 201), torch.tensor([0.0, -1e-8, 1e-8, -40.0, 40.0])])
    t = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    y_ref, dy_ref = torch.func.jvp(quick_gelu, (x,), (t,))
    y, dy = quick_gelu_jvp(x, t)
    torch.testing.assert_close(y, y_ref, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(dy, dy_ref, rtol=1e-13, atol=1e-15)
    # differentiable in t (training backpropagates through it): the map t -> dy is linear
    t.requires_grad_(True)
    (g,) = torch.autograd.grad(quick_gelu_jvp(x, t)[1].sum(), t)
    torch.testing.assert_close(g, dy_ref / t.detach(), rtol=1e-10, atol=1e-12)
    y0, none = TangentQuickGELU(timm.layers.QuickGELU())(x, None)
    assert none is None and torch.equal(y0, y)


# ---- tangent model vs torch.func.jvp -------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_torch_func_jvp(family: str, k: int) -> None:
    base = make(family)
    model = TangentViT(base, k, delta_init_std=0.05)
    x = images()
    y_ref, jdw_ref = reference(base, model, x)
    assert rel_err(jdw_ref, y_ref) > 1e-3  # the Δ moves the output: the check is not vacuous
    assert rel_err(model(x), y_ref + jdw_ref) < 1e-10
    assert rel_err(TangentViT(base, k, jvp_only=True, delta_init_std=0.05)(x), jdw_ref) < 1e-10
    assert rel_err(TangentViT(base, k)(x), base(x)) < 1e-12  # Δ = 0: timm's own (eval) forward


def test_every_new_parameter_is_linearized() -> None:
    """Each family's extra parameters are among the ones TangentViT linearizes (so the jvp
    reference above tangents them too)."""
    pairs = TangentViT(make("deit_distilled"), 1).linearization_pairs()
    assert {"head_dist.weight", "head_dist.bias", "head.weight"} <= set(pairs)
    pairs = TangentViT(make("qk_norm"), 2).linearization_pairs()
    for i in (0, 1):
        for n in ("q_norm", "k_norm"):
            assert {f"blocks.{i}.attn.{n}.weight", f"blocks.{i}.attn.{n}.bias"} <= set(pairs)


def test_distilled_output_is_mean_of_both_heads() -> None:
    """Only head_dist's Δ moves the output: half of head_dist's own JVP, as timm's eval mean."""
    base = make("deit_distilled")
    model = TangentViT(base, 1)
    x = images()
    feats = base.forward_features(x)[:, 1]  # the distillation token's features (after the final norm)
    with torch.no_grad():
        model.head_dist.delta.weight.normal_(generator=torch.Generator().manual_seed(3))
        model.head_dist.delta.bias.fill_(0.7)
    want = base(x) + 0.5 * model.head_dist.delta(feats)
    assert rel_err(model(x), want) < 1e-12


@pytest.mark.parametrize("k", [1, 2])
def test_distilled_reset_matches_jvp(k: int) -> None:
    base = make("deit_distilled")
    model = TangentViT(base, k, reset=True, reset_seed=3, reset_cls=True, delta_init_std=0.05)
    reset_base = make("deit_distilled")
    with torch.no_grad():
        for name, (w, _) in model.linearization_pairs().items():
            if name != "cls_input":
                reset_base.get_parameter(name).copy_(w)
    assert not torch.equal(reset_base.head_dist.weight, base.head_dist.weight)
    y_ref, jdw_ref = reference(reset_base, model, images())
    assert rel_err(model(images()), y_ref + jdw_ref) < 1e-10


@pytest.mark.parametrize("name", ["deit_tiny_distilled_patch16_224", "vit_base_patch16_clip_quickgelu_224",
                                  "vit_base_patch16_clip_224", "vit_small_patch14_reg4_dinov2",
                                  "deit3_small_patch16_224"])
def test_registered_timm_models_match_jvp(name: str) -> None:
    """timm's registered builders (their norm, act and token options), shrunk; no download."""
    base = perturbed(timm.create_model(name, pretrained=False, **TINY))
    model = TangentViT(base, 1, delta_init_std=0.05)
    x = images_for(base)
    y_ref, jdw_ref = reference(base, model, x)
    assert rel_err(model(x), y_ref + jdw_ref) < 1e-10
    assert rel_err(TangentViT(base, 1)(x), base(x)) < 1e-12


# ---- refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    (dict(class_token=False, global_pool="map"), r"attn_pool AttentionPoolLatent.*'map'.*SigLIP"),
    (dict(mlp_layer=SwiGLUPacked, act_layer="silu", mlp_ratio=2), r"mlp module GluMlp.*SwiGLU"),
    (dict(mlp_layer=SwiGLU, act_layer="silu"), r"mlp module SwiGLU"),
    (dict(act_layer="silu"), r"mlp activation SiLU"),
    (dict(global_pool="max"), r"global_pool='max'"),
])
def test_unsupported_options_are_refused_by_name(kw: dict, match: str) -> None:
    base = VisionTransformer(**{**TINY, **kw}).eval()
    with pytest.raises((TypeError, ValueError), match=match):
        TangentViT(base, 1)


@pytest.mark.parametrize("name,match", [
    ("vit_base_patch16_siglip_224", r"attn_pool AttentionPoolLatent.*SigLIP"),
    ("vit_giant_patch14_dinov2", r"mlp module GluMlp.*SwiGLU"),
    ("eva02_tiny_patch14_224", r"must be a timm VisionTransformer, got Eva"),
])
def test_registered_unsupported_models_refused(name: str, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        TangentViT(timm.create_model(name, pretrained=False, **TINY).eval(), 1)


def test_rms_qk_norm_refused_by_name() -> None:
    base = VisionTransformer(**TINY, qk_norm=True).eval()
    base.blocks[1].attn.k_norm = RmsNorm(8)  # timm's qk_norm ViTs with RmsNorm use other blocks
    with pytest.raises(ValueError, match=r"TAFT does not support 'blocks\.1\.attn\.k_norm' \(RmsNorm\)"):
        TangentViT(base, 1)


def test_distilled_with_fc_norm_refused() -> None:
    base = VisionTransformerDistilled(**TINY, fc_norm=True).eval()
    with pytest.raises(ValueError, match="distilled ViT \\(dist_token\\) with fc_norm"):
        TangentViT(base, 1)


# ---- DP: per-example norms of the new Δ modules -------------------------------------------
@pytest.mark.parametrize("family", ["deit_distilled", "clip_quickgelu", "qk_norm_reg_avg"])
def test_dp_fast_norms_match_microbatches(family: str) -> None:
    model = TangentViT(make(family), 2).double()
    check_fast_supported(model)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():  # Δ starts at 0; move off it so every gradient is generic
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = torch.randn(5, 1, 16, 16, dtype=torch.float64, generator=g)
    y = torch.randint(0, 5, (5,), generator=g)
    # Δβ of k_norm adds q·Δβ to a whole row of scores, which softmax ignores: exactly zero.
    assert_norms_match(model, x, y, zero_grad_suffixes=("k_norm.delta.bias",))


def _dp_model(family: str) -> tuple[TangentViT, torch.Tensor, torch.Tensor]:
    model = TangentViT(make(family), 2, delta_init_std=0.05).double()
    g = torch.Generator().manual_seed(4)
    return model, torch.randn(5, 1, 16, 16, dtype=torch.float64, generator=g), torch.randint(0, 5, (5,), generator=g)


@pytest.mark.parametrize("family", ["deit_distilled", "clip_quickgelu", "qk_norm_reg_avg"])
def test_dp_hooks_per_sample_grads_match_microbatches(family: str) -> None:
    """Opacus' own hooks (the 'hooks' DP mode) on the new Δ modules."""
    from opacus.grad_sample import GradSampleModule

    from tests.dp.test_reference import ce, microbatch_grads

    model, x, y = _dp_model(family)
    ref = microbatch_grads(model, x, y)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
    try:
        ce(gsm(x), y).sum().backward()
        for n, p in model.named_delta_parameters():
            torch.testing.assert_close(p.grad_sample, ref[n], rtol=1e-9, atol=1e-14, msg=n)
    finally:
        gsm._close()


@pytest.mark.parametrize("family", ["deit_distilled", "clip_quickgelu", "qk_norm_reg_avg"])
def test_dp_book_keeping_matches_microbatches(family: str) -> None:
    """The 'bk' DP mode's existing rules (Linear, LayerNorm on (B, H, N, d_h), DeltaScale) cover the new Δ modules."""
    from tests.dp.test_book_keeping import assert_bk_matches_reference

    model, x, y = _dp_model(family)
    assert_bk_matches_reference(model, x, y, c=1e-3, expect_clipped=True)
