"""Fast per-example squared norms vs micro-batches of size one (float64)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline_src.dp import AdditiveDelta, apply_regime, check_fast_supported, nlft_scope, register_fast_norm_sampler
from pipeline_src.dp.norm_samplers import FAST_SQ_NORM_SAMPLERS, attach_fast_norm_samplers, linear_weight_sq_norm
from tests.conftest import tiny_vit
from tests.dp.test_reference import assert_norms_match, ce


@pytest.mark.parametrize("regime", ["full", "bitfit", "layernorm", "fc"])
def test_nlft_regimes_match_microbatches(regime):
    model = tiny_vit(train=True)
    apply_regime(model, regime, nlft_scope(model))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, 16, 16, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (6,), generator=g)
    assert_norms_match(model, x, y)


@pytest.mark.parametrize("method", ["auto", "gram", "direct"])
@pytest.mark.parametrize("shape", [(5, 7), (5, 1, 7), (5, 3, 4, 7), (5, 9, 7)])
def test_linear_forms_match_explicit(method, shape):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(*shape, dtype=torch.float64, generator=g)
    gr = torch.randn(*shape[:-1], 11, dtype=torch.float64, generator=g)
    per_ex = torch.einsum("b...o,b...i->boi", gr.reshape(5, -1, 11), a.reshape(5, -1, 7))  # (B, d_out, d_in)
    got = linear_weight_sq_norm(a.reshape(5, -1, 7), gr.reshape(5, -1, 11), method)
    torch.testing.assert_close(got, per_ex.pow(2).sum((1, 2)), rtol=1e-10, atol=0)


def test_linear_unknown_method_raises():
    with pytest.raises(ValueError, match="unknown linear norm method"):
        linear_weight_sq_norm(torch.ones(2, 3, 4), torch.ones(2, 3, 5), "fancy")


@pytest.mark.parametrize("delta_shape", [(9, 8), (1, 8), (8,), (9, 1)])
def test_additive_delta_matches_microbatches(delta_shape):
    torch.manual_seed(0)
    model = nn.Sequential(AdditiveDelta(delta_shape, init_std=0.1), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 3),
                          nn.Flatten(), nn.Linear(27, 4)).double()
    x = torch.randn(5, 9, 8, dtype=torch.float64)
    y = torch.randint(0, 4, (5,))
    assert_norms_match(model, x, y)


def test_vector_layernorm_and_linear_match_microbatches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.LayerNorm(10), nn.Tanh(), nn.Linear(10, 3)).double()
    x = torch.randn(7, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (7,))
    assert_norms_match(model, x, y)


def test_clipped_contributions_are_bounded_and_sum_to_grad():
    from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

    from pipeline_src.dp import wrap_fast
    from tests.dp.test_reference import microbatch_grads

    model = tiny_vit(train=True)
    apply_regime(model, "full", nlft_scope(model))
    x = torch.randn(6, 1, 16, 16, dtype=torch.float64)
    y = torch.randint(0, 5, (6,))
    ref = microbatch_grads(model, x, y)
    c = 0.05  # small enough that every example is clipped
    gsm = wrap_fast(model, max_grad_norm=c)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    DPTensorFastGradientClipping(gsm, opt, ce(gsm(x), y), "mean").backward()
    coef = gsm.get_clipping_coef().detach()
    names = list(ref)
    flat = torch.cat([ref[n].reshape(6, -1) for n in names], 1)  # (B, P)
    assert (flat.norm(dim=1) > c).all()
    clipped = coef[:, None] * flat
    assert (clipped.norm(dim=1) <= c * (1 + 1e-9)).all()
    torch.testing.assert_close(clipped.norm(dim=1), torch.full((6,), c, dtype=torch.float64), rtol=1e-4, atol=0)
    params = dict(model.named_parameters())
    got = torch.cat([params[n].grad.reshape(-1) for n in names])
    torch.testing.assert_close(got, clipped.sum(0), rtol=1e-8, atol=1e-12)
    gsm.cleanup()


def test_uncovered_module_raises_naming_type():
    model = tiny_vit(train=True)
    apply_regime(model, "full", nlft_scope(model))
    model.cls_token.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="VisionTransformer.*cls_token"):
        check_fast_supported(model)
    model.cls_token.requires_grad_(False)
    model.patch_embed.proj.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="Conv2d"):
        check_fast_supported(model)


def test_duplicate_registration_refused():
    before = dict(FAST_SQ_NORM_SAMPLERS)

    def other(layer, activations, backprops):
        return {}

    with pytest.raises(ValueError, match="already registered"):
        register_fast_norm_sampler(nn.Linear)(other)
    with pytest.raises(ValueError, match="already registered"):  # all-or-nothing
        register_fast_norm_sampler(nn.Conv1d, nn.LayerNorm)(other)
    assert FAST_SQ_NORM_SAMPLERS == before


def test_attach_refuses_non_ghost_wrapper():
    from opacus import GradSampleModule

    with pytest.raises(TypeError, match="ghost-clipping"):
        attach_fast_norm_samplers(GradSampleModule(nn.Linear(2, 2)))
