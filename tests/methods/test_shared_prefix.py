"""An ensemble from one frozen-prefix pass gives exactly each model's own logits, and sharing the
frozen tensors changes no model."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.methods.shared_prefix import member_logits, share_frozen_tensors
from tests.conftest import tiny_vit

# compares results of different paths (batches, caches, threads): bit-equality only where the
# same kernels see the same operands, checked on any CPU (tests/rounding_guard.py)
pytestmark = pytest.mark.rounding_guard

CONFIGS = {
    "fc": {"kind": "fc"},
    "nlft": {"kind": "nlft", "k": 1},
    "full": {"kind": "full"},
    "taft": {"kind": "taft", "k": 1},
    "last": {"kind": "last", "rank": 8, "heads": 2, "every": 1},
}


def shard_models(cfg: dict, n: int = 3):
    """n models of one method, as shard models differ: their trained tensors perturbed per shard."""
    backbone = tiny_vit().float()
    models = []
    for i in range(n):
        m = build_tuned_model(backbone, cfg, num_classes=3, seed=0).eval()
        gen = torch.Generator().manual_seed(i + 1)
        state = {k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) if v.is_floating_point() else v
                 for k, v in m.trainable_state().items()}
        m.load_trainable_state(state)
        models.append(m)
    return models


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_one_prefix_pass_equals_each_models_forward(kind):
    models = shard_models(CONFIGS[kind])
    x = torch.randn(5, 1, 16, 16)
    with torch.no_grad():
        alone = torch.stack([m(x) for m in models], dim=1)
        shared = member_logits(models, x)
    assert shared.shape == (5, 3, 3)
    assert torch.equal(shared, alone)
    assert not torch.equal(alone[:, 0], alone[:, 1])  # the models differ


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_sharing_frozen_tensors_changes_no_model(kind):
    models = shard_models(CONFIGS[kind])
    x = torch.randn(4, 1, 16, 16)
    with torch.no_grad():
        before = [m(x) for m in models]
    frozen = sum(t.numel() for t in [*models[1].parameters(), *models[1].buffers()] if not t.requires_grad)
    freed = share_frozen_tensors(models)
    assert freed == (2 * frozen if kind != "full" else 0)  # full trains every parameter: nothing shared
    with torch.no_grad():
        assert all(torch.equal(m(x), b) for m, b in zip(models, before))
    if kind != "full":
        p0 = dict(models[0].named_parameters())
        shared = [n for n, p in models[2].named_parameters() if not p.requires_grad]
        assert shared and all(p0[n].data_ptr() == dict(models[2].named_parameters())[n].data_ptr() for n in shared)


def test_unequal_frozen_tensors_are_not_shared():
    models = shard_models(CONFIGS["nlft"], n=2)
    frozen = [n for n, p in models[1].named_parameters() if not p.requires_grad][0]
    with torch.no_grad():
        dict(models[1].named_parameters())[frozen].add_(1.0)
    share_frozen_tensors(models)
    assert dict(models[1].named_parameters())[frozen].data_ptr() != dict(models[0].named_parameters())[frozen].data_ptr()
