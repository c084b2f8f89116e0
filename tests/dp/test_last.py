"""DP for the LAST side network (pipeline_src.last): fast per-example norms vs
micro-batches of size one, and DP training on cached feature lists (fast, bk, hooks)."""
from __future__ import annotations

import torch

from pipeline_src.dp import check_fast_supported, train_private
from pipeline_src.last import features as features_mod
from pipeline_src.last import side_network as last
from tests.conftest import tiny_vit
from tests.dp.test_reference import assert_norms_match, ce, fixed_coins


def _side_and_features(n: int = 6):
    backbone = tiny_vit(train=True)
    backbone.requires_grad_(False)
    side = last.SideNetwork(backbone, rank=4, heads=2, every=1, modules_per_block=1, num_classes=5, seed=1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, 1, 16, 16, dtype=torch.float64, generator=g)
    y = torch.randint(0, 5, (n,), generator=g)
    return side, features_mod.extract_features(backbone, x, every=1), y


def test_side_network_is_covered_and_norms_match():
    side, feats, y = _side_and_features()
    check_fast_supported(side)
    with torch.no_grad():  # B starts at zero in some configs; make every gradient non-trivial
        for p in side.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert_norms_match(side, feats, y, zero_grad_suffixes=("a_k.bias",))


def test_side_network_dp_training_fast_and_bk_equal_hooks():
    states = {}
    for mode in ("fast", "bk", "hooks"):
        side, feats, y = _side_and_features(n=24)
        states[mode], rec = train_private(side, feats, y, loss_fn=ce, epochs=1, batch_size=6, lr=0.5, epsilon=3.0,
                                          delta=1e-2, max_grad_norm=0.1, **fixed_coins(0), mode=mode)
        assert rec["steps_taken"] == 4
    for n, t in states["fast"].items():
        torch.testing.assert_close(t, states["hooks"][n], rtol=1e-7, atol=1e-9, msg=n)
        torch.testing.assert_close(states["bk"][n], states["hooks"][n], rtol=1e-7, atol=1e-9, msg=n)


def test_side_network_with_ffn_is_covered_in_every_mode():
    """The FFN ablation (ffn_hidden) is plain LayerNorm/Linear: fast norms match micro-batches of
    one, and bk / fast / hooks DP training give the same model on the same coins."""
    backbone = tiny_vit(train=True)
    backbone.requires_grad_(False)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, 1, 16, 16, dtype=torch.float64, generator=g)
    y = torch.randint(0, 5, (12,), generator=g)
    feats = features_mod.extract_features(backbone, x, every=2)

    def side():
        return last.SideNetwork(backbone, rank=4, heads=2, every=2, modules_per_block=2, num_classes=5, seed=1,
                                ffn_hidden=3)

    net = side()
    check_fast_supported(net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert_norms_match(net, feats, y, zero_grad_suffixes=("a_k.bias",))
    states = {mode: train_private(side(), feats, y, loss_fn=ce, epochs=1, batch_size=4, lr=0.5, epsilon=3.0,
                                  delta=1e-2, max_grad_norm=0.1, **fixed_coins(0), mode=mode)[0]
              for mode in ("fast", "bk", "hooks")}
    assert any(".fc1." in n for n in states["bk"])
    for n, t in states["hooks"].items():
        torch.testing.assert_close(states["fast"][n], t, rtol=1e-7, atol=1e-9, msg=n)
        torch.testing.assert_close(states["bk"][n], t, rtol=1e-7, atol=1e-9, msg=n)
