"""`full` with `init: random`: the from-scratch reference of the backbone's architecture."""
from __future__ import annotations

import torch

from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.plan.config import validate_config
from tests.conftest import REPO, tiny_vit


def test_random_init_replaces_every_pretrained_tensor_and_trains_them_all():
    backbone = tiny_vit(seed=0)
    with torch.no_grad():  # stands in for pretraining: every tensor moved off its init, LayerNorms included
        for p in backbone.parameters():
            p.add_(0.1 * torch.randn_like(p))
    pretrained = {n: p.detach().clone() for n, p in backbone.named_parameters()}
    scratch = build_tuned_model(backbone, {"kind": "full", "init": "random"}, num_classes=5, seed=3)
    again = build_tuned_model(backbone, {"kind": "full", "init": "random"}, num_classes=5, seed=3)
    other = build_tuned_model(backbone, {"kind": "full", "init": "random"}, num_classes=5, seed=4)
    tuned = build_tuned_model(backbone, {"kind": "full"}, num_classes=5, seed=3)
    state, same, diff = scratch.trainable_state(), again.trainable_state(), other.trainable_state()
    assert set(state) == set(tuned.trainable_state())  # every parameter trains, as full's
    for name, p in pretrained.items():
        if name.startswith("head."):
            continue
        assert not torch.equal(state[name], p), name  # nothing of the pretraining is kept
        assert torch.equal(state[name], same[name])  # one seed: one init (every shard the same)
        assert torch.equal(tuned.trainable_state()[name], p)  # the default still starts pretrained
    assert any(not torch.equal(state[n], diff[n]) for n in state if n.endswith("weight") and "norm" not in n)
    assert all(p is not q for p, q in zip(backbone.parameters(), scratch.parameters()))  # the backbone is untouched
    assert torch.equal(dict(backbone.named_parameters())["pos_embed"], pretrained["pos_embed"])


def test_init_is_a_key_of_full_only():
    import pytest
    import yaml

    from pipeline_src.plan.config import ConfigError

    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["methods"]["scratch"] = {"kind": "full", "init": "random"}
    assert validate_config(cfg, count_samples=False)["methods"]["scratch"]["init"] == "random"
    cfg["methods"]["fc"]["init"] = "random"
    with pytest.raises(ConfigError, match="methods.fc.init"):
        validate_config(cfg, count_samples=False)
