import pytest
import torch

from pipeline_src.methods.registry import build_tuned_model, get_method, register_method
from tests.conftest import tiny_vit


@pytest.mark.parametrize("cfg, trainable_prefixes", [
    ({"kind": "fc"}, ("head.",)),
    ({"kind": "nlft", "k": 1}, ("blocks.1.", "norm.", "head.")),
    ({"kind": "full"}, ("",)),
])
def test_prefix_plus_tail_is_the_network_and_only_the_tail_trains(cfg, trainable_prefixes):
    model = build_tuned_model(tiny_vit(), cfg, num_classes=3, seed=0)
    x = torch.randn(4, 1, 16, 16, dtype=torch.float64)
    assert torch.allclose(model(x), model.model(x))
    names = model.trainable_state().keys()
    assert names and all(n.startswith(trainable_prefixes) for n in names)
    model(x).sum().backward()
    for n, p in model.model.named_parameters():
        assert (p.grad is not None) == n.startswith(trainable_prefixes), n


def test_head_init_depends_only_on_the_seed():
    a = build_tuned_model(tiny_vit(), {"kind": "fc"}, 3, seed=7).trainable_state()
    torch.randn(100)  # global RNG use in between must not matter
    b = build_tuned_model(tiny_vit(), {"kind": "fc"}, 3, seed=7).trainable_state()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_registry_refuses_duplicates_and_unknown_kinds():
    with pytest.raises(ValueError, match="already registered"):
        register_method(get_method("fc"))
    with pytest.raises(ValueError, match="unknown method kind 'lora'"):
        get_method("lora")


def test_nlft_on_deit_distilled_trains_both_heads():
    """timm's distilled DeiT averages `head` and `head_dist` at eval: both must train."""
    from timm.models.deit import VisionTransformerDistilled

    from pipeline_src.methods.nonlinear import TailFineTune

    base = VisionTransformerDistilled(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                                      num_heads=4)
    tuned = TailFineTune(base, k=1)
    trainable = {n for n, p in tuned.named_parameters() if p.requires_grad}
    assert {"model.head_dist.weight", "model.head.weight", "model.blocks.1.attn.qkv.weight"} <= trainable
    assert "model.blocks.0.attn.qkv.weight" not in trainable


def test_cls_true_trains_a_class_token_entering_the_tuned_blocks():
    """NLFT's CLS = T (the TAFT paper's Table 4 searched it for NLFT-1): the class-token row of the
    tuned blocks' input is a trained token; it is part of the trained state and reloads."""
    import pytest

    from pipeline_src.methods.registry import build_tuned_model, train_cross_entropy

    backbone = tiny_vit(seed=0)
    model = build_tuned_model(backbone, {"kind": "nlft", "k": 1, "reset_cls": True}, 5, seed=0)
    plain = build_tuned_model(backbone, {"kind": "nlft", "k": 1}, 5, seed=0)
    assert set(model.trainable_state()) == set(plain.trainable_state()) | {"tail_cls.weight"}
    x = torch.randn(6, 1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.arange(6) % 5
    h = model.prefix(x)
    assert not torch.allclose(model.forward_from_prefix(h), plain.forward_from_prefix(h))  # the row is replaced
    start = model.trainable_state()["tail_cls.weight"]
    train_cross_entropy(model, h, y, {"epochs": 2, "batch_size": 3, "lr": 1e-2, "weight_decay": 0.0}, 0, "t")
    trained = model.trainable_state()
    assert not torch.equal(trained["tail_cls.weight"], start)  # the token learns
    again = build_tuned_model(backbone, {"kind": "nlft", "k": 1, "reset_cls": True}, 5, seed=0)
    again.load_trainable_state(trained)
    assert torch.equal(again.forward_from_prefix(h), model.forward_from_prefix(h))
    with pytest.raises(ValueError, match="reset_cls"):
        build_tuned_model(backbone, {"kind": "nlft", "k": 1, "reset_cls": True}, 5, seed=0).__class__(
            tiny_vit(seed=0), k=0, reset_cls=True)
