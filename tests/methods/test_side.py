import torch

from pipeline_src.last.features import extract_features
from pipeline_src.methods.registry import build_tuned_model, get_method
from tests.conftest import tiny_vit


def test_side_tuned_trains_only_the_side_network_from_cached_block_features():
    backbone = tiny_vit()
    model = build_tuned_model(backbone, {"kind": "last", "rank": 8, "heads": 2, "every": 1},
                              num_classes=3, seed=0)
    x = torch.randn(12, 1, 16, 16, dtype=torch.float64)
    h = model.prefix(x)
    assert h.shape == (12, 3, 17, 32) and h.grad_fn is None
    assert torch.equal(h[:, -1], extract_features(backbone, x, every=1)[-1])
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    stats = get_method("last").train(model, h, torch.arange(12) % 3,
                                     {"epochs": 2, "batch_size": 4, "lr": 1e-2, "weight_decay": 0.0}, 0, "t")
    assert stats["train_loss"] > 0
    assert all(torch.equal(before[k], v) for k, v in model.backbone.state_dict().items())
    assert all(p.grad is None for p in model.backbone.parameters())
    # cached-feature path and image path give the same logits
    assert torch.allclose(model.forward_from_prefix(h), model(x))
