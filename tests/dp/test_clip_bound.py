"""The DP guarantee's premise, tested from outside: with one example per step and no noise, the
model moves by at most lr·C, in every mode and for every supported layer, on models built to
tempt each mode (a parameter used outside its module, a module run twice, tied parameters).
A mode either keeps the bound or refuses the model, naming the parameter or module and itself."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.layers import LayerScale
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pipeline_src.taft.opacus_support  # noqa: F401  (registers DeltaScale's Opacus grad sampler)
from pipeline_src.dp.additive import AdditiveDelta
from pipeline_src.dp.parameter_use import ParameterUseError
from pipeline_src.dp.private_training import MODES, dp_backward, make_private_model
from pipeline_src.taft.jvp_layers import DeltaScale

D, T, CLASSES, C = 4, 3, 3, 0.05


def _layer(kind: str) -> nn.Module:
    layer = {"linear": lambda: nn.Linear(D, D), "layernorm": lambda: nn.LayerNorm(D),
             "layerscale": lambda: LayerScale(D, init_values=0.5), "deltascale": lambda: DeltaScale(D),
             "additive": lambda: AdditiveDelta((1, D))}[kind]()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p))  # non-zero everywhere, so a repeated call has a gradient
    return layer


class Tempting(nn.Module):
    """`layer` trains; a frozen head makes logits from the token mean.

    Args:
        kind: the supported layer type.
        temptation: "none", "functional" (the parent adds its own use of the layer's first
            parameter), "twice" (the layer runs on its own output) or "tied" (a second layer holds
            the same parameters).
    """

    def __init__(self, kind: str, temptation: str) -> None:
        super().__init__()
        self.temptation = temptation
        self.layer = _layer(kind)
        self.second = _layer(kind) if temptation == "tied" else nn.Identity()
        if temptation == "tied":
            for name, p in self.layer.named_parameters(recurse=False):
                setattr(self.second, name, p)
        self.head = nn.Linear(D, CLASSES).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer(x)
        if self.temptation == "functional":
            p = next(self.layer.parameters())
            h = h + x * p.reshape(-1)[:D]  # the parameter reaches the loss outside self.layer
        elif self.temptation == "twice":
            h = self.layer(h)
        h = self.second(h)
        return self.head(h.mean(1))


KINDS = ("linear", "layernorm", "layerscale", "deltascale", "additive")
TEMPTATIONS = ("none", "functional", "twice", "tied")


def one_noiseless_step(model: nn.Module, mode: str, x: torch.Tensor, y: torch.Tensor) -> float:
    """‖Δθ‖ / lr after one DP step on one example (q = 1, σ = 0): that example's clipped contribution."""
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=1.0)
    loader = DataLoader(TensorDataset(x, y), batch_size=1)
    gen = torch.Generator().manual_seed(0)
    _, module, dp_opt, dp_loader = make_private_model(model, opt, loader, mode=mode, sigma=0.0, max_grad_norm=C,
                                                      noise_generator=torch.Generator().manual_seed(1),
                                                      sampler_generator=gen)
    model.train()
    try:
        xb, yb = next(iter(dp_loader))
        assert len(yb) == 1  # q = 1 over one example
        dp_opt.zero_grad()
        losses = F.cross_entropy(module(xb), yb, reduction="none")
        dp_backward(module, dp_opt, losses, mode)
        dp_opt.step()
    finally:
        module.cleanup()
    return float(torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before)]).norm())


def unclipped_norm(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    norm = float(torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad]).norm())
    model.zero_grad()
    return norm


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temptation", TEMPTATIONS)
def test_one_example_moves_the_model_by_at_most_c(mode: str, kind: str, temptation: str):
    torch.manual_seed(0)
    x, y = 10 * torch.randn(1, T, D, dtype=torch.float64), torch.tensor([1])
    model = Tempting(kind, temptation).double()
    assert unclipped_norm(model, x, y) > 2 * C  # the clip is active: the bound is not met by accident
    try:
        moved = one_noiseless_step(model, mode, x, y)
    except ParameterUseError as e:
        refused_for = {"functional": "used outside its module's forward", "twice": "ran twice in one forward",
                       "tied": "is shared with"}
        assert temptation in refused_for, f"{mode} refused a plain {kind}: {e}"
        assert refused_for[temptation] in str(e) and f"DP mode {mode!r}" in str(e)
        assert "'layer" in str(e) or "'second" in str(e), e  # names the parameter or module
        return
    assert moved <= C * (1 + 1e-6), f"{mode}/{kind}/{temptation}: one example moved the model by {moved} > C = {C}"
    if temptation == "none":
        assert moved >= C * (1 - 1e-4), "the clipped step must reach C when the clip is active (c = C / (norm + 1e-6))"
    assert temptation in ("none", "twice") and (temptation == "none" or mode == "hooks"), \
        f"{mode} accepted {temptation!r} use: it must refuse it"


def test_every_mode_refuses_functional_use_of_a_child_linear_naming_it():
    """The case the audit measured (0.0689 > C = 0.05 in fast mode); fast mode once failed with
    AttributeError '_norm_sample'."""
    for mode in MODES:
        torch.manual_seed(0)
        model = Tempting("linear", "functional").double()
        x = 10 * torch.randn(1, T, D, dtype=torch.float64)
        with pytest.raises(ParameterUseError, match=rf"DP mode '{mode}': trainable parameter 'layer\.weight'"):
            one_noiseless_step(model, mode, x, torch.tensor([1]))


def test_a_module_reached_by_two_paths_but_called_once_is_accepted():
    """An alias attribute is neither a tie nor a repeat."""
    torch.manual_seed(0)
    model = Tempting("linear", "none").double()
    model.alias = model.layer
    x = 10 * torch.randn(1, T, D, dtype=torch.float64)
    for mode in MODES:
        assert one_noiseless_step(model, mode, x, torch.tensor([1])) <= C * (1 + 1e-6)


class TemptingEmbedding(nn.Module):
    """nn.Embedding trains (token ids in); temptations as `Tempting`, but no repeat (ids in, floats out)."""

    def __init__(self, temptation: str) -> None:
        super().__init__()
        self.temptation = temptation
        self.layer = nn.Embedding(7, D)
        self.second = nn.Embedding(7, D) if temptation == "tied" else None
        if self.second is not None:
            self.second.weight = self.layer.weight
        self.head = nn.Linear(D, CLASSES).requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.layer(ids)
        if self.temptation == "functional":
            h = h + self.layer.weight[0]
        if self.second is not None:
            h = h + self.second(ids)
        return self.head(h.mean(1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temptation", ["none", "functional", "tied"])
def test_embedding_one_example_moves_the_model_by_at_most_c(mode: str, temptation: str):
    torch.manual_seed(0)
    model = TemptingEmbedding(temptation).double()
    with torch.no_grad():
        model.layer.weight.mul_(10)
    ids, y = torch.tensor([[1, 2, 2]]), torch.tensor([1])
    assert unclipped_norm(model, ids, y) > 2 * C
    try:
        moved = one_noiseless_step(model, mode, ids, y)
    except ParameterUseError as e:
        assert temptation != "none", f"{mode} refused a plain embedding: {e}"
        assert "'layer.weight'" in str(e) and f"DP mode {mode!r}" in str(e)
        return
    assert temptation == "none", f"{mode} accepted {temptation!r} use of an embedding"
    assert C * (1 - 1e-4) <= moved <= C * (1 + 1e-6)
