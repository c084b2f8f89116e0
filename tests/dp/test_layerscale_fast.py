"""The `fast` DP mode on LayerScale: timm's LayerScale γ (nlft) and TAFT's DeltaScale Δγ,
against per-example gradients from micro-batches of size one (float64)."""
from __future__ import annotations

import pytest
import torch
from timm.layers import LayerScale
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.dp import apply_regime, check_fast_supported, nlft_scope, train_private, wrap_fast
from pipeline_src.dp.norm_samplers import FAST_SQ_NORM_SAMPLERS, layer_scale_sq_norms
from pipeline_src.taft import TangentViT
from pipeline_src.taft.jvp_layers import DeltaScale
from tests.dp.test_reference import assert_norms_match, ce, fixed_coins, microbatch_grads

torch.set_num_threads(1)


def ls_vit(seed: int = 0, global_pool: str = "token") -> VisionTransformer:
    """Tiny ViT with LayerScale. With 'token' pooling only the class token's row of the last
    block reaches the loss, which would hide a wrong sum over tokens there: the tests below
    always cover a block (or a pooling) where every token's gradient is non-zero."""
    torch.manual_seed(seed)
    return VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                             num_heads=4, init_values=0.2, global_pool=global_pool).double()


def data(n: int = 6, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 1, 16, 16, dtype=torch.float64, generator=g), torch.randint(0, 5, (n,), generator=g))


def perturb(model: torch.nn.Module, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def taft_ls(k: int = 2, global_pool: str = "token") -> TangentViT:
    model = TangentViT(ls_vit(global_pool=global_pool), k).double()
    perturb(model)  # Δ starts at 0; move off it so every gradient is generic
    return model


def test_registered_for_both_scale_types() -> None:
    assert FAST_SQ_NORM_SAMPLERS[LayerScale] is layer_scale_sq_norms
    assert FAST_SQ_NORM_SAMPLERS[DeltaScale] is layer_scale_sq_norms


@pytest.mark.parametrize("regime", ["full", "layernorm"])
def test_nlft_layer_scale_norms_match_microbatches(regime: str) -> None:
    model = ls_vit()
    apply_regime(model, regime, nlft_scope(model, 2))
    if regime == "layernorm":  # LayerScale γ alone next to the LayerNorms
        for blk in model.blocks:
            blk.ls1.gamma.requires_grad_(True)
            blk.ls2.gamma.requires_grad_(True)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any(n.endswith("ls1.gamma") for n in names) and any(n.endswith("ls2.gamma") for n in names)
    check_fast_supported(model)
    assert_norms_match(model, *data())


@pytest.mark.parametrize("k,pool", [(1, "avg"), (2, "token"), (2, "avg")])
def test_taft_delta_scale_norms_match_microbatches(k: int, pool: str) -> None:
    model = taft_ls(k, pool)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sum(n.endswith(("ls1.delta.weight", "ls2.delta.weight")) for n in names) == 2 * k
    check_fast_supported(model)
    assert_norms_match(model, *data())


def test_vector_inputs_match_microbatches() -> None:
    """LayerScale on (B, c) vectors (no token dim)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), LayerScale(8, 0.5), torch.nn.Tanh(), DeltaScale(8),
                                torch.nn.Linear(8, 3)).double()
    with torch.no_grad():
        model[3].weight.normal_()
    x = torch.randn(7, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (7,))
    assert_norms_match(model, x, y)


def test_fast_clipped_sum_matches_microbatches() -> None:
    """Every example is clipped to C and the clipped sum is Σ_i c_i ∇ℓ_i of the micro-batches."""
    from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

    model = taft_ls()
    x, y = data()
    ref = microbatch_grads(model, x, y)
    c = 1e-3
    gsm = wrap_fast(model, max_grad_norm=c)
    try:
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        DPTensorFastGradientClipping(gsm, opt, ce(gsm(x), y), "mean").backward()
        coef = gsm.get_clipping_coef().detach()
    finally:
        gsm.cleanup()
    names = list(ref)
    flat = torch.cat([ref[n].reshape(len(y), -1) for n in names], 1)
    assert (flat.norm(dim=1) > c).all()
    clipped = coef[:, None] * flat
    torch.testing.assert_close(clipped.norm(dim=1), torch.full((len(y),), c, dtype=torch.float64), rtol=1e-4, atol=0)
    params = dict(model.named_parameters())
    for n in names:
        want = torch.einsum("b,b...->...", coef, ref[n])
        torch.testing.assert_close(params[n].grad, want, rtol=1e-7, atol=1e-12 * float(clipped.abs().max()), msg=n)


def test_fast_and_bk_train_the_same_layer_scale_model() -> None:
    """train_private in 'fast' (was refused for LayerScale) and 'bk' mode: same coins, same model."""
    states = {}
    for mode in ("fast", "bk"):
        model = ls_vit(global_pool="avg")
        apply_regime(model, "full", nlft_scope(model))
        x, y = data(20, seed=2)
        states[mode], rec = train_private(model, x, y, loss_fn=ce, epochs=1, batch_size=10, lr=0.5, epsilon=4.0,
                                          delta=1e-3, max_grad_norm=0.5, mode=mode, **fixed_coins(7))
        assert rec["mode"] == mode
    assert any(n.endswith("ls1.gamma") for n in states["fast"])
    for n, v in states["fast"].items():
        torch.testing.assert_close(v, states["bk"][n], rtol=1e-6, atol=1e-9, msg=n)
    assert not torch.equal(states["fast"]["blocks.1.ls1.gamma"], ls_vit(global_pool="avg").blocks[1].ls1.gamma.detach())


def test_in_place_layer_scale_refused() -> None:
    model = ls_vit()
    apply_regime(model, "full", nlft_scope(model))
    model.blocks[1].ls2.inplace = True
    with pytest.raises(NotImplementedError, match=r"LayerScale 'blocks\.1\.ls2' is in-place"):
        check_fast_supported(model)
