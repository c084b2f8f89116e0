"""Opacus per-sample gradients and ghost-clipping norms of TangentViT's Δ vs micro-batches of size one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.taft import TangentViT
from pipeline_src.taft.opacus_support import register_opacus_grad_samplers
from pipeline_src.vit.parts import FromPrefix

pytestmark = pytest.mark.usefixtures("float64_default")  # float64 for reference comparisons
torch.set_num_threads(1)  # tiny tensors: extra threads only add sync cost on the shared 2-core box


@pytest.fixture(scope="module")
def setup():
    register_opacus_grad_samplers()
    torch.manual_seed(0)
    base = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                             num_heads=4, init_values=0.2).eval()
    model = TangentViT(base, 2, reset_cls=True, delta_init_std=1e-2)
    g = torch.Generator().manual_seed(1)
    h = model.prefix(torch.randn(4, 1, 16, 16, generator=g))
    y = torch.randint(0, 5, (4,), generator=g)
    per_sample = {}
    for b in range(4):  # the independent reference: micro-batches of size one
        model.zero_grad()
        F.cross_entropy(model.forward_from_prefix(h[b:b + 1]), y[b:b + 1], reduction="sum").backward()
        for n, p in model.named_delta_parameters():
            per_sample.setdefault(n, []).append(p.grad.clone())
    return model, h, y, {n: torch.stack(v) for n, v in per_sample.items()}


@pytest.mark.parametrize("force_functorch", [False, True])
def test_per_sample_grads(setup, force_functorch: bool) -> None:
    from opacus.grad_sample import GradSampleModule

    model, h, y, ref = setup
    gsm = GradSampleModule(FromPrefix(model), batch_first=True, loss_reduction="sum",
                           force_functorch=force_functorch)
    gsm.zero_grad()
    F.cross_entropy(gsm(h), y, reduction="sum").backward()
    for n, p in model.named_delta_parameters():
        assert torch.allclose(p.grad_sample, ref[n], rtol=1e-9, atol=1e-14), n
    gsm._close()


def test_ghost_clipping_norms(setup) -> None:
    from opacus.grad_sample import GradSampleModuleFastGradientClipping

    model, h, y, ref = setup
    model.zero_grad()
    gsm = GradSampleModuleFastGradientClipping(FromPrefix(model), batch_first=True, loss_reduction="sum",
                                               max_grad_norm=1e9, use_ghost_clipping=True)
    F.cross_entropy(gsm(h), y, reduction="none").sum().backward()
    expected = torch.cat([v.flatten(1) for v in ref.values()], dim=1).norm(dim=1)
    assert torch.allclose(gsm.get_norm_sample(), expected, rtol=1e-9)
    gsm._close()
