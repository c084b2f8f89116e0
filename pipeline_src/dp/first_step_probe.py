"""The first-step probe of every DP job: two checks, on the first non-empty training step, that the
per-example norms the clipping uses describe the gradients the step applies. They hold by
construction where the model uses each trainable parameter only through its module's forward;
the probe catches what construction and the named pattern refusals (`parameter_use`) cannot see.

Every mode computes an example's norm from records: each trainable module call's inputs a and
output gradient g (Opacus' hooks in fast, ghost and hooks mode; the taps in bk). The probe records
the same (a, g) (a forward hook registered after the mode's own, on the tensor the mode's backward
hook sees), takes ONE extra backward of the loss of one example j on the first step's graph
(retained; the mode's own backward hooks paused), and checks:

1. *batch attribution*: the per-example gradients rebuilt from the records are 0 on every row
   i ≠ j. A module whose rows are not the batch's examples (a trainable Linear applied to a
   batch-free (T, d) table with T = B, or to a weight with B rows) spreads example j over rows
   that the clip treats as other examples: a clipped row each, so example j moves the model by up
   to B·C (measured 4.2 C in bk).
2. *rebuilt gradient*: Σ_i of the rebuilt per-example gradients equals autograd's ∇ℓ_j of the same
   loss. A parameter that reaches the loss by a path the records miss (a global forward hook
   that returns 2× the output or adds 0.5·F.linear(x, W), a view `inner.weight.T` made in
   `__init__`, a use under `torch._C.DisableTorchFunction()`) makes them differ; fast and ghost,
   whose step is autograd's gradient, would exceed C there (measured 1.89 C), and bk and hooks
   would train on a gradient that is not the model's.

Both refuse by name (`ParameterUseError`: the parameter, the mode, the size of the difference).
Tolerance: `rtol(dtype)` of ‖∇ℓ_j‖ (the rebuilt and autograd sums add the same terms in another
order). The probe runs again on the next step whenever the global forward hooks change (the
FLOP counter's module tracker excepted), so a global hook registered after the first step is
probed too. Cost: one backward of ℓ_j and one per-layer rebuild, on the first step only
(`benchmarks/bench_dp.py`, rows `probe`).
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from pipeline_src.dp.bk_rules import BK_RULES
from pipeline_src.dp.parameter_use import ParameterUseError, trainable_owners

_RTOL = {torch.float64: 1e-8, torch.float32: 1e-3}  # 16-bit types: 5e-2


def rtol(dtype: torch.dtype) -> float:
    """Relative tolerance of the probe's comparisons in `dtype` (relative to ‖∇ℓ_j‖)."""
    return _RTOL.get(dtype, 5e-2)


def global_forward_hooks() -> frozenset[tuple[str, int]]:
    """Ids of the global module forward hooks and pre-hooks, except those of torch's module
    trackers (the FLOP counter registers a fresh pair at every `counting` block; they return None)."""
    from torch.nn.modules import module as mod

    out = set()
    for kind, table in (("hook", mod._global_forward_hooks), ("pre-hook", mod._global_forward_pre_hooks)):
        for k, hook in table.items():
            if type(getattr(hook, "__self__", None)).__name__ not in ("ModuleTracker", "ModTracker"):
                out.add((kind, k))
    return frozenset(out)


class _Call:
    """One trainable module call on the probe step: its inputs and (after the probe's backward) its
    output gradient."""
    __slots__ = ("module", "activations", "grad")

    def __init__(self, module: nn.Module, activations: list) -> None:
        self.module, self.activations, self.grad = module, activations, None


def per_example_gradients(module: nn.Module, activations: list, grad: torch.Tensor
                          ) -> dict[nn.Parameter, tuple[torch.Tensor, torch.Tensor]]:
    """{param: (squared per-example norms (B,), Σ_i per-example gradient)} of one module call, from
    its records: the book-keeping rule of its type where there is one, else Opacus' per-sample
    gradient (its grad sampler, or functorch), formed one module at a time.

    Args:
        module: the trainable module.
        activations: its positional inputs (detached).
        grad: the output gradient, (B, ...).
    """
    b = grad.shape[0]
    rule = BK_RULES.get(type(module))
    if rule is not None:
        norms, clip = rule(module, activations, grad)
        sums = clip(torch.ones(b, dtype=grad.dtype, device=grad.device))
        return {p: (norms[p], sums[p]) for p in norms}
    from opacus.grad_sample.functorch import ft_compute_per_sample_gradient, prepare_layer
    from opacus.grad_sample.grad_sample_module import GradSampleModule

    sampler = GradSampleModule.GRAD_SAMPLERS.get(type(module))
    if sampler is None:
        if not hasattr(module, "ft_compute_sample_grad"):
            prepare_layer(module)
        sampler = ft_compute_per_sample_gradient
    return {p: (gs.reshape(b, -1).pow(2).sum(1), gs.sum(0)) for p, gs in sampler(module, activations, grad).items()
            if p.requires_grad}


class FirstStepProbe:
    """Records the trainable modules' calls of one training forward and checks them (module
    docstring). Register it after the mode's own hooks; call `start`/`stop` around each training
    forward and `check(losses)` before the mode's backward.

    Args:
        model: the unwrapped model (its trainable set is fixed here).
        mode: the DP mode, named in errors.
    Attributes:
        runs: probes run so far (tests and the benchmark read it).
    """

    def __init__(self, model: nn.Module, mode: str) -> None:
        self.mode = mode
        layers = trainable_owners(model)
        self._names = {id(getattr(m, n)): f"{name}.{n}" if name else n for name, m, own in layers for n in own}
        self.parameters = [getattr(m, n) for _, m, own in layers for n in own]
        self.armed, self.runs = True, 0
        self._globals = global_forward_hooks()
        self._recording = self._collecting = False
        self._calls: list[_Call] = []
        self.handles = [m.register_forward_hook(self._observe) for _, m, _ in layers]

    def start(self) -> bool:
        """Begin a training forward; records it if the probe is armed (first step, or the global
        forward hooks changed since the last probe). Returns whether it records."""
        if not self.armed and global_forward_hooks() != self._globals:
            self.armed = True
        self._calls, self._recording = [], self.armed
        return self._recording

    def stop(self) -> None:
        self._recording = False

    def _observe(self, module: nn.Module, inputs: tuple, output) -> None:
        if not self._recording:
            return None
        call = _Call(module, [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs])
        self._calls.append(call)
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda g, call=call: self._grab(call, g))
        return None

    def _grab(self, call: _Call, g: torch.Tensor) -> None:
        if self._collecting:
            call.grad = g.detach() if call.grad is None else call.grad + g.detach()
        return None

    def check(self, losses: torch.Tensor, pause: AbstractContextManager | None = None) -> None:
        """If this step was recorded: one backward of ℓ_j (j: the example with the largest loss) on the
        retained graph, then the batch-attribution and rebuilt-gradient checks.

        Args:
            losses: the step's per-example losses, (B,), whose graph the mode's backward then uses.
            pause: context in which the mode's own backward hooks are off (Opacus' `disable_hooks`,
                bk's pass-through taps).
        Raises:
            ParameterUseError: naming the parameter, the mode and the size of the difference.
        """
        calls, self._calls = self._calls, []
        if not calls or not self.armed or not losses.requires_grad or losses.dim() != 1 or len(losses) == 0:
            return
        self.armed, self._globals, self.runs = False, global_forward_hooks(), self.runs + 1
        b, j = losses.shape[0], int(losses.detach().argmax())
        self._collecting = True
        try:
            with pause or nullcontext():
                grads = torch.autograd.grad(losses[j], self.parameters, retain_graph=True, allow_unused=True)
        finally:
            self._collecting = False
        with torch.no_grad():
            self._compare(calls, grads, b, j)

    def _compare(self, calls: list[_Call], grads: tuple, b: int, j: int) -> None:
        off = dict.fromkeys(map(id, self.parameters), 0.0)  # Σ_{i≠j} ‖row i of ∇_p ℓ_j‖², from the records
        own = dict(off)
        rebuilt: dict[int, torch.Tensor] = {}
        for call in calls:
            if call.grad is None:  # not on ℓ_j's path: no gradient
                continue
            self._check_batch_dim(call, b)
            for p, (sq, total) in self._rebuild(call, b, j).items():
                sq = sq.detach().double()
                mine = float(sq[j])
                own[id(p)] += mine
                off[id(p)] += float(sq.sum()) - mine
                rebuilt[id(p)] = total if id(p) not in rebuilt else rebuilt[id(p)] + total
        auto = {id(p): g for p, g in zip(self.parameters, grads) if g is not None}
        sq_auto = sum(float(torch.linalg.vector_norm(g)) ** 2 for g in auto.values())
        sq_rebuilt = sum(float(torch.linalg.vector_norm(g)) ** 2 for g in rebuilt.values())
        scale = max(sq_auto, sq_rebuilt) ** 0.5
        tol = rtol(self.parameters[0].dtype) * scale
        worst = max(self.parameters, key=lambda p: off[id(p)])
        leak = max(off[id(worst)], 0.0) ** 0.5
        if leak > tol:
            raise ParameterUseError(
                f"DP mode {self.mode!r}: batch-attribution probe: with only example {j}'s loss, trainable parameter "
                f"'{self._names[id(worst)]}' has per-example gradient norm {leak:.3g} on the other {b - 1} rows "
                f"(example {j}'s own: {own[id(worst)] ** 0.5:.3g}); its module's rows are not the batch's "
                f"examples (a batch-free tensor whose first dimension equals the batch size, or a batch statistic), "
                f"so each row would be clipped as if it were an example. Apply the module to the batch, or freeze it")
        for p in self.parameters:
            a, r = auto.get(id(p)), rebuilt.get(id(p))
            if a is None and r is None:
                continue
            diff = float(torch.linalg.vector_norm((a if a is not None else 0) - (r if r is not None else 0)))
            if diff > tol:
                raise ParameterUseError(
                    f"DP mode {self.mode!r}: rebuilt-gradient check: the gradient of trainable parameter "
                    f"'{self._names[id(p)]}' rebuilt from its module's (input, output-gradient) records differs from "
                    f"autograd's by {diff:.3g} ({diff / scale:.3g} of ‖∇ℓ_{j}‖ = {scale:.3g}); the parameter "
                    f"reaches the loss by a path its per-example norm does not see (a global forward hook that "
                    f"changes the output or uses the weight, a view of the weight made outside the forward, a use "
                    f"under DisableTorchFunction, an in-place change of the module's input). Remove that path, or "
                    f"freeze the parameter")

    @staticmethod
    def _rebuild(call: _Call, b: int, j: int) -> dict[nn.Parameter, tuple[torch.Tensor, torch.Tensor]]:
        """`per_example_gradients` of the call; from row j alone (1/B of the work) when every other
        row of its output gradient is exactly 0, as it is wherever rows are examples (the rules are
        linear in g: those rows' gradients are 0 too)."""
        g, acts = call.grad, call.activations
        others = torch.cat([g[:j], g[j + 1:]])
        if others.numel() and bool(others.ne(0).any()) or any(
                isinstance(x, torch.Tensor) and (x.dim() == 0 or x.shape[0] != b) for x in acts):
            return per_example_gradients(call.module, acts, g)
        row = per_example_gradients(call.module, [x[j:j + 1] if isinstance(x, torch.Tensor) else x for x in acts],
                                    g[j:j + 1])
        out = {}
        for p, (sq, total) in row.items():
            full = torch.zeros(b, dtype=sq.dtype, device=sq.device)
            full[j] = sq[0]
            out[p] = (full, total)
        return out

    def _check_batch_dim(self, call: _Call, b: int) -> None:
        if call.grad.dim() == 0 or call.grad.shape[0] != b:
            names = [self._names[id(p)] for p in call.module.parameters(recurse=False) if id(p) in self._names]
            raise ParameterUseError(
                f"DP mode {self.mode!r}: batch-attribution probe: trainable parameter '{names[0]}' belongs to a module "
                f"whose output has shape {tuple(call.grad.shape)}, not a batch of {b} examples first; per-example "
                f"gradients need one example per row. Apply the module to the batch, or freeze it")

    def remove(self) -> None:
        """Remove the recording hooks."""
        for h in self.handles:
            h.remove()
        self.handles, self._calls = [], []
