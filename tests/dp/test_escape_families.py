"""Issue 43's families of models that slipped past the clip (float64, σ = 0, C = 0.05; measured on
b7c748c: 0.0946 for a global hook returning 2× the output, 0.0852 for a view of the weight made in
`__init__` or used under DisableTorchFunction, 0.2097 in bk for a Linear applied to a batch-free
table with B rows): in every mode, each case keeps every example's clipped contribution at or under
C, or is refused naming the mode and the parameter or module. The contribution is measured with the
batch's losses masked to one example i (so batch confusion shows), max over i."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.module import register_module_forward_hook
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

from pipeline_src.dp.private_training import MODES, dp_backward, make_private_model

D, T, B, C = 4, 3, 3, 0.05
F64 = torch.float64


class Escape(nn.Module):
    """A trainable `inner` (Linear, or LayerNorm for 'global_ln_weight'), a trainable `mix` for the
    batch-free cases, and a frozen head with B classes; `case` adds the escape."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.inner = nn.LayerNorm(D, dtype=F64) if case == "global_ln_weight" else nn.Linear(D, D, dtype=F64)
        with torch.no_grad():
            for p in self.inner.parameters():
                p.copy_(torch.randn_like(p))
        self.head = nn.Linear(D, B, dtype=F64).requires_grad_(False)  # B classes: a weight with B rows
        if case in ("batch_free", "weight_rows", "batch_free_other"):
            self.mix = nn.Linear(D, D, dtype=F64)
            self.register_buffer("table", torch.randn(B + (case == "batch_free_other"), D, dtype=F64))
        if case == "init_view":
            self.view = self.inner.weight.T  # a view of the trainable weight, made outside any forward
        self.stash = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.case == "checkpoint":
            h = checkpoint(self.inner, x, use_reentrant=False)
        elif self.case == "checkpoint_reentrant":
            h = checkpoint(self.inner, x, use_reentrant=True)
        elif self.case == "keyword":
            h = self.inner(input=x)
        else:
            h = self.inner(x)
        if self.case == "init_view":
            h = h + x @ self.view
        elif self.case == "hook_view":
            h = h + x @ self.stash  # stored by a global hook during inner's call
        elif self.case == "disable_torch_function":
            with torch._C.DisableTorchFunction():
                h = h + x @ self.inner.weight.T
        elif self.case in ("batch_free", "batch_free_other"):
            h = h + self.mix(self.table).mean(0)  # a (T, d) table, T = B (or B + 1), no batch in it
        pooled = h.mean(1)
        if self.case == "weight_rows":  # a trainable parametrization of the head's weight (B rows)
            return pooled @ self.mix(self.head.weight).T
        return self.head(pooled)


def global_hook(case: str, model: Escape):
    """The global forward hook of a case, acting on `model.inner` only (returns None elsewhere)."""
    def hook(module, args, out):
        if module is not model.inner:
            return None
        if case == "global_double":
            return 2 * out  # no parameter: the norm sees ∂L/∂(2y), p.grad the true path
        if case == "global_ln_weight":
            return out * module.weight
        if case == "global_linear":
            return out + 0.5 * F.linear(args[0], module.weight)
        if case == "hook_view":
            model.stash = module.weight.T
        return None
    return hook


GLOBAL = ("global_double", "global_ln_weight", "global_linear", "hook_view")
CASES = (*GLOBAL, "init_view", "disable_torch_function", "batch_free", "batch_free_other", "weight_rows",
         "checkpoint", "checkpoint_reentrant", "keyword")


def masked_step(model: nn.Module, mode: str, x, y, i: int, hook_case: str | None, after_wrapping: bool,
                probe: bool = True) -> float:
    """Example i's clipped contribution: B·‖Δθ‖ after one noiseless DP step (q = 1, lr = 1, the step
    normalised by the expected batch B) in which only example i has a loss (`probe`: False disarms the
    first-step probe)."""
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    handle = register_module_forward_hook(global_hook(hook_case, model)) if hook_case and not after_wrapping else None
    module = None
    try:
        _, module, dp_opt, _ = make_private_model(
            model, torch.optim.SGD(params, lr=1.0), DataLoader(TensorDataset(x, y), batch_size=B), mode=mode,
            sigma=0.0, max_grad_norm=C, noise_generator=torch.Generator().manual_seed(1),
            sampler_generator=torch.Generator().manual_seed(0))
        if hook_case and after_wrapping:
            handle = register_module_forward_hook(global_hook(hook_case, model))
        (module.probe if mode == "bk" else module.first_step_probe).armed = probe
        model.train()
        dp_opt.zero_grad()
        mask = torch.zeros(B, dtype=F64)
        mask[i] = 1.0
        losses = F.cross_entropy(module(x), y, reduction="none") * mask
        dp_backward(module, dp_opt, losses, mode)
        dp_opt.step()
    finally:
        if handle is not None:
            handle.remove()
        if module is not None:
            module.cleanup()
    return B * float(torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before)]).norm())


# what refuses each case: the first-step probe's two checks, or a named pattern refusal
REFUSAL = {**dict.fromkeys(("global_double", "global_ln_weight", "global_linear", "disable_torch_function"),
                           "rebuilt-gradient check"),
           **dict.fromkeys(("init_view", "hook_view"), "used outside its module's forward"),
           "batch_free": "batch-attribution probe", "weight_rows": "batch-attribution probe",
           "batch_free_other": "without a batch dimension", "checkpoint": "runs inside a backward pass",
           "checkpoint_reentrant": "runs with gradients disabled", "keyword": "keyword arguments"}


def refused_by_name(e: Exception, mode: str, case: str) -> bool:
    return (f"DP mode {mode!r}" in str(e) and REFUSAL[case] in str(e)
            and any(f"'{n}" in str(e) for n in ("inner", "mix")))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case,after_wrapping", [(c, False) for c in CASES] + [(c, True) for c in GLOBAL])
def test_each_escape_keeps_the_bound_or_is_refused_by_name(case: str, after_wrapping: bool, mode: str):
    x, y = 10 * torch.randn(B, T, D, dtype=F64, generator=torch.Generator().manual_seed(1)), torch.tensor([1, 0, 2])
    worst = 0.0
    for i in range(B):
        torch.manual_seed(0)  # the same model for every i (a view cannot be deep-copied)
        model = Escape(case)
        try:
            worst = max(worst, masked_step(model, mode, x, y, i, case if case in GLOBAL else None, after_wrapping))
        except (NotImplementedError, ValueError) as e:
            assert refused_by_name(e, mode, case), f"{mode}/{case}: not refused by name for {REFUSAL[case]!r}: {e}"
            return
    assert worst <= C * (1 + 1e-6), f"{mode}/{case}: one example moved the model by {worst:.4f} > C = {C}"


@pytest.mark.parametrize("mode,case", [("fast", "global_double"), ("ghost", "global_linear"),
                                       ("fast", "disable_torch_function"), ("bk", "batch_free"),
                                       ("hooks", "weight_rows")])
def test_the_escapes_exceed_the_bound_without_the_probe(mode: str, case: str):
    """The measurement above can fail: with the first-step probe disarmed, these exceed C (fast 0.100,
    ghost 0.0749, fast 0.0998, bk 0.0933, hooks 0.0694 against C = 0.05)."""
    x, y = 10 * torch.randn(B, T, D, dtype=F64, generator=torch.Generator().manual_seed(1)), torch.tensor([1, 0, 2])
    worst = 0.0
    for i in range(B):
        torch.manual_seed(0)
        model = Escape(case)
        worst = max(worst, masked_step(model, mode, x, y, i, case if case in GLOBAL else None, False, probe=False))
    assert worst > C * 1.3
