"""The fc regime's DP training from the head's inputs (`methods/fc_head.py`) against the full path it
replaces (the tuned model run from its prefix features at every step): float64, the same noise and
Poisson coins, every kind, DP-SGD and full-batch DP-GD. Also: the files are the rows' head inputs and
are named for the run's clean-up, and the path is refused where it does not apply."""
from __future__ import annotations

import copy

import pytest
import torch

from pipeline_src.dp import train_private
from pipeline_src.dp.full_batch import train_private_full_batch
from pipeline_src.methods.fc_head import HeadOnly, head_call, head_inputs, only_head_trains
from pipeline_src.methods.private import per_example_loss, select_trainable
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.store.atomic import remove_stale_temps
from pipeline_src.vit.parts import FromPrefix
from tests.conftest import tiny_vit

METHODS = {
    "nlft": {"kind": "nlft", "k": 1},
    "taft": {"kind": "taft", "k": 1},
    "taft-jvp": {"kind": "taft", "k": 2, "reset_cls": True, "jvp_only": True, "loss": "ce"},
    "last": {"kind": "last", "rank": 4, "heads": 2},
}
N = 23


def fc_model(method: str):
    cfg = METHODS[method]
    model = build_tuned_model(tiny_vit(train=True), cfg, num_classes=5, seed=0)
    select_trainable(model, cfg["kind"], "fc", train_head=True)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(N, 1, 16, 16, dtype=torch.float64, generator=g)
    return model, model.prefix(x), torch.randint(0, 5, (N,), generator=g), cfg


def train(full_batch: bool, module, inputs, y, loss_fn):
    kw = dict(loss_fn=loss_fn, epochs=3, lr=0.5, epsilon=8.0, delta=1e-3, max_grad_norm=0.3,
              noise_generator=torch.Generator().manual_seed(1))
    if full_batch:
        return train_private_full_batch(module, inputs, y, micro_batch_size=5, **kw)[0]
    return train_private(module, inputs, y, batch_size=6, sampler_generator=torch.Generator().manual_seed(2), **kw)[0]


@pytest.mark.parametrize("full_batch", [False, True], ids=["dp-sgd", "full-batch"])
@pytest.mark.parametrize("method", list(METHODS))
def test_the_head_trained_on_its_inputs_is_the_model_trained_from_its_prefix(tmp_path, method, full_batch):
    model, h, y, cfg = fc_model(method)
    reference = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    call = head_call(model, cfg["kind"])
    assert only_head_trains(model, call[0])
    rows = head_inputs(model.eval(), *call, h, 4, tmp_path / "shard0.safetensors")  # batches of 4: a short last one
    loss_fn = per_example_loss(cfg)
    want = list(train(full_batch, FromPrefix(reference), h, y, loss_fn).values())
    got = list(train(full_batch, HeadOnly(*call, [r is not None for r in rows]), [r for r in rows if r is not None],
                     y, loss_fn).values())
    assert len(want) == len(got) == len(before) > 0
    for a, b, start in zip(want, got, before):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
        assert not torch.equal(a, start)  # it trained


def test_the_files_hold_the_head_inputs_and_a_killed_jobs_are_cleared(tmp_path):
    model, h, y, cfg = fc_model("taft")
    call = head_call(model, cfg["kind"])
    rows = head_inputs(model.eval(), *call, h, 5, tmp_path / "shard0.safetensors")
    seen = []
    hook = call[0].register_forward_hook(lambda _m, args, _o: seen.append(args))
    with torch.no_grad():
        model.forward_from_prefix(h)
    hook.remove()
    for r, a in zip(rows, seen[0]):
        assert (r is None) == (a is None)
        if r is not None:
            torch.testing.assert_close(r[torch.arange(N)], a, rtol=1e-12, atol=1e-12)
            assert torch.equal(r[3:9], r[torch.arange(3, 9)])
    files = [r.path for r in rows if r is not None]
    assert files and all(f.parent == tmp_path and f.name.startswith(".shard0.head_input") for f in files)
    assert remove_stale_temps(tmp_path) == []  # their writer (this process) runs


def test_the_path_is_refused_where_more_than_the_head_trains():
    model, _, _, cfg = fc_model("nlft")
    call = head_call(model, cfg["kind"])
    assert only_head_trains(model, call[0])
    next(model.model.blocks[-1].parameters()).requires_grad_(True)
    assert not only_head_trains(model, call[0])
    assert head_call(model, "fc") is None
