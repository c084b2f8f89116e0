"""DP-SGD loop: book-keeping (bk, one backward), fast, Opacus ghost and Opacus hooks give the
same model for the same seed (they differ only in how the clipped sum is computed), and the
record matches the engine's accountant."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.dp import REGIMES, apply_regime, epsilon_for, nlft_scope, train_private
from tests.conftest import tiny_vit
from tests.dp.test_reference import ce, fixed_coins


def _run(mode: str, regime: str = "full"):
    model = tiny_vit(train=True)
    apply_regime(model, regime, nlft_scope(model))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 1, 16, 16, dtype=torch.float64, generator=g)
    y = torch.randint(0, 5, (40,), generator=g)
    steps = []
    state, rec = train_private(model, x, y, loss_fn=ce, epochs=2, batch_size=10, lr=0.5, epsilon=4.0, delta=1e-3,
                               max_grad_norm=0.5, **fixed_coins(7), mode=mode, progress=steps.append)
    return model, state, rec, steps


def test_modes_agree_and_record_matches_accountant():
    base = tiny_vit(train=True)
    results = {m: _run(m) for m in ("fast", "bk", "ghost", "hooks")}
    model, state, rec, steps = results["fast"]
    assert rec["steps_taken"] == rec["steps"] == 8 == len(steps)
    assert rec["epsilon_spent"] == pytest.approx(
        epsilon_for(sigma=rec["sigma"], sample_rate=rec["sample_rate"], steps=8, delta=1e-3), rel=1e-9)
    assert rec["epsilon_spent"] <= 4.0
    assert set(state) == {n for n, p in model.named_parameters() if p.requires_grad}
    moved = max((state[n] - dict(base.named_parameters())[n]).abs().max().item() for n in state)
    assert moved > 1e-3
    for other in ("bk", "ghost", "hooks"):
        for n, t in results[other][1].items():
            torch.testing.assert_close(t, state[n], rtol=1e-7, atol=1e-9, msg=f"{other}: {n}")
    # frozen parameters stay put and Opacus' hooks are gone afterwards
    for n, p in model.named_parameters():
        if n not in state:
            assert torch.equal(p, dict(base.named_parameters())[n])
    assert not model._forward_hooks and not any(hasattr(p, "_norm_sample") for p in model.parameters())
    bk_model, _, bk_rec, _ = results["bk"]
    assert bk_rec["mode"] == "bk" and bk_rec["epsilon_spent"] == rec["epsilon_spent"]
    assert not any(m._forward_hooks for m in bk_model.modules())
    assert all(p.requires_grad == (n in state) for n, p in bk_model.named_parameters())


@pytest.mark.parametrize("mode", ["fast", "bk"])
@pytest.mark.parametrize("regime", REGIMES)
def test_regimes_train_only_their_parameters(regime, mode):
    model, state, rec, _ = _run(mode, regime)
    names = set(state)
    if regime == "fc":
        assert names == {"head.weight", "head.bias"}
    elif regime == "bitfit":
        assert names and all(n.endswith("bias") for n in names) and "blocks.0.attn.qkv.bias" not in names
    elif regime == "layernorm":
        assert names == {"blocks.1.norm1.weight", "blocks.1.norm1.bias", "blocks.1.norm2.weight",
                         "blocks.1.norm2.bias", "norm.weight", "norm.bias"}
    else:
        assert "blocks.1.mlp.fc1.weight" in names and "blocks.0.mlp.fc1.weight" not in names


def test_unknown_mode_and_regime_raise():
    model = tiny_vit(train=True)
    with pytest.raises(ValueError, match="unknown DP regime"):
        apply_regime(model, "lora", nlft_scope(model))
    apply_regime(model, "fc", nlft_scope(model))
    x = torch.randn(20, 1, 16, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="unknown DP mode"):
        train_private(model, x, torch.zeros(20, dtype=torch.long), epochs=1, batch_size=5, lr=0.1, epsilon=2.0,
                      delta=1e-3, max_grad_norm=1.0, mode="turbo")


def test_loss_fn_must_be_per_example():
    model = tiny_vit(train=True)
    apply_regime(model, "fc", nlft_scope(model))
    x = torch.randn(20, 1, 16, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="one loss per example"):
        train_private(model, x, torch.zeros(20, dtype=torch.long), loss_fn=lambda o, y: ce(o, y).mean(),
                      epochs=1, batch_size=5, lr=0.1, epsilon=2.0, delta=1e-3, max_grad_norm=1.0)


def test_empty_poisson_batches_still_step_and_modes_agree():
    states, sizes = {}, {}
    for mode in ("fast", "bk", "hooks"):
        model = tiny_vit(train=True)
        apply_regime(model, "fc", nlft_scope(model))
        g = torch.Generator().manual_seed(0)
        x = torch.randn(20, 1, 16, 16, dtype=torch.float64, generator=g)
        y = torch.randint(0, 5, (20,), generator=g)
        log = []
        states[mode], rec = train_private(model, x, y, epochs=1, batch_size=1, lr=0.1, epsilon=8.0, delta=1e-2,
                                          max_grad_norm=1.0, **fixed_coins(0), mode=mode, progress=log.append)
        sizes[mode] = [d["batch"] for d in log]
        assert rec["steps_taken"] == 20
    assert 0 in sizes["fast"] and sizes["fast"] == sizes["hooks"] == sizes["bk"]  # q = 1/20: empty batches occur
    for n, t in states["fast"].items():
        torch.testing.assert_close(t, states["hooks"][n], rtol=1e-7, atol=1e-9, msg=n)
        torch.testing.assert_close(states["bk"][n], states["hooks"][n], rtol=1e-7, atol=1e-9, msg=n)
