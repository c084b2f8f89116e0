"""Every DP trainer keeps frozen modules in eval mode: a frozen BatchNorm stem keeps its running
statistics and normalises by them, frozen drop-path is off (as `train_tangent`, which trains in
eval mode); the trainable head still trains in train mode (Opacus hooks need it)."""
from __future__ import annotations

import pytest
import torch
from timm.layers import DropPath
from torch import nn

from pipeline_src.dp import train_private
from pipeline_src.dp.frozen_modes import train_trainable_only
from pipeline_src.dp.full_batch import train_private_full_batch
from tests.dp.test_reference import ce


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(6), DropPath(0.5), nn.Linear(6, 3)).double()
    model[0].requires_grad_(False)  # the frozen stem
    return model


def _data(n: int = 40):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 6, dtype=torch.float64, generator=g) * 3 + 1, torch.randint(0, 3, (n,), generator=g)


def _record_modes(model: nn.Sequential) -> list[tuple[bool, bool, bool]]:
    seen = []
    model[1].register_forward_pre_hook(lambda m, a: seen.append((model[0].training, m.training, model[2].training)))
    return seen


def _check(model: nn.Sequential, seen: list, stats: tuple[torch.Tensor, ...]) -> None:
    assert seen and all(s == (False, False, True) for s in seen), seen[:3]
    assert torch.equal(model[0].running_mean, stats[0]) and torch.equal(model[0].running_var, stats[1])
    assert int(model[0].num_batches_tracked) == 0


@pytest.mark.parametrize("mode", ["bk", "fast", "ghost", "hooks"])
def test_every_dp_sgd_forward_sees_frozen_modules_in_eval_mode(mode):
    model = _model()
    seen = _record_modes(model)
    stats = (model[0].running_mean.clone(), model[0].running_var.clone())
    x, y = _data()
    train_private(model, x, y, loss_fn=ce, epochs=1, batch_size=10, lr=0.5, epsilon=8.0, delta=1e-3,
                  max_grad_norm=1.0, mode=mode)
    _check(model, seen, stats)


def test_full_batch_dp_gd_keeps_frozen_modules_in_eval_mode():
    model = _model()
    seen = _record_modes(model)
    stats = (model[0].running_mean.clone(), model[0].running_var.clone())
    x, y = _data()
    train_private_full_batch(model, x, y, loss_fn=ce, epochs=2, lr=0.5, epsilon=8.0, delta=1e-3,
                             max_grad_norm=1.0, micro_batch_size=10)
    _check(model, seen, stats)


def test_train_trainable_only_sets_modes_by_trainable_parameters():
    model = _model().eval()
    train_trainable_only(model)
    assert (model.training, model[0].training, model[1].training, model[2].training) == (True, False, False, True)


# taft is not here: its frozen prefix is a copy built in eval mode whose drop-path this hook does
# not see; its trainer (train_tangent) runs the whole model in eval mode.
KINDS = {"nlft": {"kind": "nlft", "k": 1}, "last": {"kind": "last", "rank": 8, "heads": 2}}


@pytest.mark.parametrize("mode", ["bk", "fast", "ghost", "hooks", "full_batch"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_runs_its_frozen_prefix_in_eval_mode_from_images(kind, mode):
    """A backbone with drop_path_rate 0.3, trained from images (no feature cache): the frozen
    blocks' drop-path stays off in every DP forward, for every kind and mode."""
    from pipeline_src.methods.private import per_example_loss, select_trainable
    from pipeline_src.methods.registry import build_tuned_model
    from tests.conftest import tiny_vit

    backbone = tiny_vit(drop_path_rate=0.3).float()
    model = build_tuned_model(backbone, KINDS[kind], 3, seed=0).double()
    select_trainable(model, kind, "full", True)
    if mode == "fast":  # fast has no Conv2d/position-embedding sampler: keep the patch embedding frozen
        for n, p in model.named_parameters():
            if "patch_embed" in n or n.endswith(("cls_token", "pos_embed")):
                p.requires_grad_(False)
    frozen = [m for m in model.modules() if type(m).__name__ == "DropPath"
              and not any(p.requires_grad for p in m.parameters())]
    assert frozen
    seen = []
    for m in frozen:
        m.register_forward_pre_hook(lambda m, a: seen.append(m.training))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 1, 16, 16, dtype=torch.float64, generator=g), torch.randint(0, 3, (20,), generator=g)
    common = dict(loss_fn=per_example_loss(KINDS[kind]), epochs=1, lr=0.1, epsilon=8.0, delta=1e-3, max_grad_norm=1.0)
    if mode == "full_batch":
        train_private_full_batch(model, x, y, micro_batch_size=10, **common)
    else:
        train_private(model, x, y, batch_size=10, mode=mode, **common)
    assert seen and not any(seen)
