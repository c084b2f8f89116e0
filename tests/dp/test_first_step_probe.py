"""The first-step probe (`dp/first_step_probe.py`) against independent references, float64: the
per-example gradients it rebuilds from (input, output-gradient) records equal per-example gradients
from micro-batches of size one (each path: book-keeping rules, Opacus' grad samplers, functorch);
on real models it passes, once per job (the FLOP counter's global hooks do not re-arm it); a global
hook registered after the first step re-arms it; its refusals name the parameter, the mode and the
size of the difference."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from timm.layers import LayerScale
from torch import nn
from torch.nn.modules.module import register_module_forward_hook
from torch.utils.data import DataLoader, TensorDataset

from pipeline_src.dp import apply_regime, nlft_scope
from pipeline_src.dp.first_step_probe import per_example_gradients
from pipeline_src.dp.parameter_use import ParameterUseError
from pipeline_src.dp.private_training import MODES, dp_backward, make_private_model
from pipeline_src.job.counters import counting
from tests.conftest import tiny_vit

F64 = torch.float64


class Shift(nn.Module):
    """A module no rule or Opacus grad sampler knows (the functorch path): x · s + s²."""

    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.randn(4, dtype=F64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s + self.s.pow(2)


def _modules() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    return {
        "linear-tokens-gram": (nn.Linear(4, 6, dtype=F64), torch.randn(3, 2, 4, dtype=F64)),
        "linear-tokens-direct": (nn.Linear(2, 2, dtype=F64), torch.randn(3, 5, 2, dtype=F64)),
        "linear-vectors": (nn.Linear(4, 3, dtype=F64), torch.randn(3, 4, dtype=F64)),
        "layernorm-no-bias": (nn.LayerNorm(4, bias=False, dtype=F64), torch.randn(3, 2, 4, dtype=F64)),
        "layerscale": (LayerScale(4, init_values=0.5).double(), torch.randn(3, 2, 4, dtype=F64)),
        "embedding": (nn.Embedding(5, 4, dtype=F64), torch.tensor([[1, 2, 2], [0, 4, 1], [3, 3, 3]])),
        "conv1d-opacus": (nn.Conv1d(2, 3, 2, dtype=F64), torch.randn(3, 2, 5, dtype=F64)),
        "custom-functorch": (Shift(), torch.randn(3, 2, 4, dtype=F64)),
    }


@pytest.mark.parametrize("name", list(_modules()))
def test_rebuilt_per_example_gradients_equal_micro_batches_of_one(name: str):
    module, x = _modules()[name]
    with torch.no_grad():
        g = torch.randn_like(module(x))  # an output gradient, (B, ...)
    got = per_example_gradients(module, [x], g)
    params = [p for p in module.parameters() if p.requires_grad]
    assert set(got) == set(params)
    for p in params:
        per_example = torch.stack([torch.autograd.grad((module(x[i:i + 1]) * g[i:i + 1]).sum(), p)[0]
                                   for i in range(len(x))])  # micro-batches of one
        sq, total = got[p]
        # different summation orders: float64 rounding, not bit-equality
        torch.testing.assert_close(sq, per_example.flatten(1).pow(2).sum(1), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(total, per_example.sum(0), rtol=1e-10, atol=1e-12)


def _steps(mode: str, n_steps: int, *, late_hook=None, regime: str = "full"):
    """`n_steps` DP steps of a tiny ViT under the FLOP counter; `late_hook` is registered globally
    after the first. Returns the probe."""
    model = tiny_vit(train=True)
    apply_regime(model, regime, nlft_scope(model))
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(6, 1, 16, 16, dtype=F64, generator=g), torch.randint(0, 5, (6,), generator=g)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    _, module, dp_opt, _ = make_private_model(model, opt, DataLoader(TensorDataset(x, y), batch_size=6), mode=mode,
                                              sigma=0.0, max_grad_norm=0.5)
    probe = module.probe if mode == "bk" else module.first_step_probe
    handle = None
    try:
        for step in range(n_steps):
            if step == 1 and late_hook is not None:
                handle = register_module_forward_hook(late_hook)
            dp_opt.zero_grad()
            with counting("train", len(y), "cpu"):  # registers a fresh pair of global module hooks
                dp_backward(module, dp_opt, F.cross_entropy(module(x), y, reduction="none"), mode)
            dp_opt.step()
    finally:
        module.cleanup()
        if handle is not None:
            handle.remove()
    return probe


@pytest.mark.parametrize("mode", MODES)
def test_the_probe_passes_a_real_model_once_per_job(mode: str):
    probe = _steps(mode, 3)
    assert probe.runs == 1 and not probe.armed


def test_a_global_hook_registered_after_the_first_step_re_arms_the_probe():
    assert _steps("bk", 3, late_hook=lambda m, a, out: None).runs == 2  # probed again, and passes
    head = "head"

    def double_head(m, a, out):
        return 2 * out if isinstance(m, nn.Linear) and m.out_features == 5 else None
    for mode in ("fast", "bk"):
        with pytest.raises(ParameterUseError, match=rf"DP mode '{mode}': rebuilt-gradient check: .*'{head}\.weight'"):
            _steps(mode, 3, late_hook=double_head, regime="fc")


def test_a_refusal_states_the_size_of_the_difference():
    """A global hook doubling a trainable Linear's output: autograd's gradient is twice the rebuilt
    one, so the difference is the rebuilt gradient itself, half of autograd's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3, dtype=F64))
    x, y = torch.randn(2, 4, dtype=F64), torch.tensor([0, 2])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _, module, dp_opt, _ = make_private_model(model, opt, DataLoader(TensorDataset(x, y), batch_size=2), mode="fast",
                                              sigma=0.0, max_grad_norm=0.5)
    handle = register_module_forward_hook(lambda m, a, out: 2 * out if m is model[0] else None)
    try:
        losses = F.cross_entropy(module(x), y, reduction="none")
        j = int(losses.argmax())
        auto = torch.autograd.grad(losses[j], model[0].weight, retain_graph=True)[0]
        with pytest.raises(ParameterUseError) as e:
            dp_backward(module, dp_opt, losses, "fast")
    finally:
        handle.remove()
        module.cleanup()
    m = re.search(r"parameter '0\.weight' .* differs from autograd's by ([0-9.e+-]+)", str(e.value))
    assert m and float(m.group(1)) == pytest.approx(float(auto.norm()) / 2, rel=1e-2), str(e.value)


@pytest.mark.parametrize("name", ["linear-tokens-gram", "embedding", "custom-functorch"])
def test_the_one_row_shortcut_equals_the_full_rebuild(name: str):
    """Where only row j of the output gradient is non-zero the probe rebuilds from row j alone."""
    from pipeline_src.dp.first_step_probe import FirstStepProbe, _Call

    module, x = _modules()[name]
    with torch.no_grad():
        g = torch.randn_like(module(x))
    g[[0, 2]] = 0
    call = _Call(module, [x])
    call.grad = g
    short, full = FirstStepProbe._rebuild(call, 3, 1), per_example_gradients(module, [x], g)
    assert set(short) == set(full)
    for p, (sq, total) in full.items():
        torch.testing.assert_close(short[p][0], sq, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(short[p][1], total, rtol=1e-10, atol=1e-12)
