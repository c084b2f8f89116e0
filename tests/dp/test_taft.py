"""DP for the TAFT tangent model (pipeline_src.taft): its Δ modules are covered by the
fast norm samplers, and per-example norms match micro-batches of size one."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.dp import check_fast_supported
from pipeline_src.taft import tangent_vit
from tests.conftest import tiny_vit
from tests.dp.test_reference import assert_norms_match


@pytest.mark.parametrize("reset_cls", [False, True])
def test_tangent_vit_norms_match_microbatches(reset_cls):
    model = tangent_vit.TangentViT(tiny_vit(train=True), k=1, reset_cls=reset_cls).double()
    check_fast_supported(model)
    with torch.no_grad():  # Δ starts at 0; move off it so every gradient is generic
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 1, 16, 16, dtype=torch.float64, generator=g)
    y = torch.randint(0, 5, (5,), generator=g)
    assert_norms_match(model, x, y)
