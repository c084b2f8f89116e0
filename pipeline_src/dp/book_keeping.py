"""Book-keeping (BK) clipping: per-example clipped gradient sums from ONE backward pass.

Bu, Wang, Zha, Karypis, "Differentially Private Optimization on Large Model at Small Cost",
ICML 2023. Ghost clipping (Li et al. 2022) needs two backward passes: one for the
per-example norms, a second one for Σ_i c_i ∇ℓ_i. BK does one:

1. forward with the trainable parameters *detached* (so autograd never computes their
   gradients) while forward hooks record each trainable layer's input a and tap its output y;
2. one backward of Σ_i ℓ_i that ends at the taps: each tap receives the per-example output
   gradients g = ∂ℓ_i/∂y_i and applies its layer's rule at once (no parameter gradient is
   formed; g is kept only where the clipped sum needs it);
3. per-example squared norms from (a, g) by the per-layer rules below, summed over layers;
   c_i = min(1, C / (‖∇ℓ_i‖ + 1e-6)), exactly Opacus' clipping factor;
4. the clipped sum per layer directly from (a, c ⊙ g), e.g. for nn.Linear
   ∇W = Σ_i c_i g_iᵀ a_i as one GEMM, written to `p.grad` for Opacus' DPOptimizer
   (DPOptimizerFastGradientClipping: noise, scaling, accounting).

Per-layer rules (module types matched exactly, as Opacus does):
- nn.Linear on (B, *, d_in): weight norm by the Gram form ⟨a aᵀ, g gᵀ⟩, the vector form
  ‖a‖²‖g‖² (T = 1), or the direct form ‖g_iᵀ a_i‖² when T·(d_in+d_out) > d_in·d_out
  (then the per-example gradients, no larger than a and g, are kept and contracted with c);
  bias Σ_t g_t (Lee & Kifer 2021; Li et al. 2022).
- nn.LayerNorm / timm LayerNorm affine: γ: Σ_t g ⊙ x̂, β: Σ_t g.
- AdditiveDelta: g summed over its broadcast dims.
- nn.Embedding: ‖∇W_i‖² = Σ_{t,t'} [idx_t = idx_t'] ⟨g_t, g_t'⟩; clipped sum by index_add.
- timm LayerScale (γ) and TAFT's DeltaScale (Δγ of a LayerScale): Σ_t x ⊙ g.

Limits: every module owning trainable parameters must have a rule (else
`check_bk_supported` names it); each trainable module runs at most once per forward; the
loss of example i must depend on example i only (no batch statistics; the first step's probe,
`first_step_probe`, refuses a module whose rows are not the examples, and a parameter reaching the
loss outside the records). On the probed step the forward keeps the parameters in the graph.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from pipeline_src.dp.bk_rules import BK_RULES, Clip, _TimmLayerScale
from pipeline_src.dp.first_step_probe import FirstStepProbe
from pipeline_src.dp.parameter_use import (
    ParameterUseGuard,
    batch_size_of,
    refuse_calls_in_backward,
    shared_parameters,
    trainable_owners,
)


def check_bk_supported(model: nn.Module) -> None:
    """Raise if a module owning trainable parameters has no book-keeping rule.

    Raises:
        NotImplementedError: naming the module type, its path and its trainable parameters.
    """
    for name, m, own in trainable_owners(model):
        if type(m) not in BK_RULES:
            raise NotImplementedError(
                f"book-keeping clipping: no rule for module type {type(m).__module__}.{type(m).__qualname__} "
                f"(module '{name or '<root>'}', trainable parameters {own}); freeze it, hold the parameter in a "
                f"supported module ({', '.join(sorted(t.__qualname__ for t in BK_RULES))}), register one with "
                f"register_bk_rule, or use mode='ghost'/'hooks'")
        if _TimmLayerScale is not None and type(m) is _TimmLayerScale and m.inplace:
            raise NotImplementedError(f"book-keeping clipping: LayerScale '{name}' is in-place (inplace=True), "
                                      f"which overwrites the input its gradient needs")
        if type(m) is nn.Embedding and (m.scale_grad_by_freq or m.sparse or m.max_norm is not None):
            raise NotImplementedError(f"book-keeping clipping: nn.Embedding '{name}' with scale_grad_by_freq, sparse "
                                      f"or max_norm is not supported")


class _Record:
    """One trainable layer's call: its inputs, and (after the backward) its norms and clip."""
    __slots__ = ("module", "activations", "norms", "clip", "batch", "passthrough")

    def __init__(self, module: nn.Module, activations: list) -> None:
        self.module, self.activations, self.passthrough = module, activations, False
        self.norms: dict[nn.Parameter, torch.Tensor] | None = None
        self.clip: Clip | None = None
        self.batch: int | None = None


class _Tap(torch.autograd.Function):
    """Identity on a trainable layer's output y; its backward applies the layer's rule to
    ∂L/∂y as soon as the engine has it, so output gradients that the clip does not need
    (LayerNorm, biases, direct-form Linear) are freed at once. `anchor` connects every tap to
    the one tensor the backward is taken to."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, anchor: torch.Tensor, record: _Record) -> torch.Tensor:
        ctx.record, ctx.anchor_like = record, (anchor.dtype, anchor.device)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        rec = ctx.record
        dtype, device = ctx.anchor_like
        if rec.passthrough:  # the first-step probe's backward: records stay for the clipped one
            return gy, torch.zeros((), dtype=dtype, device=device), None
        rec.batch = gy.shape[0]
        rec.norms, rec.clip = BK_RULES[type(rec.module)](rec.module, rec.activations, gy)
        rec.activations = None  # the clip closure keeps what it needs
        return gy, torch.zeros((), dtype=dtype, device=device), None


class BookKeepingModule(nn.Module):
    """Wraps a model for single-backward DP clipping: `forward` runs it with the trainable
    parameters detached and taps each trainable layer's output; `clipped_backward(losses)`
    takes one backward to the taps, where each layer's rule turns (a, g) into per-example
    squared norms, and then adds Σ_i c_i ∇ℓ_i to each trainable `p.grad`.

    Args:
        module: the model; the trainable set is fixed here (its requires_grad flags).
        max_grad_norm: clipping bound C.
    Attributes (after `clipped_backward`):
        per_sample_gradient_norms: ‖∇ℓ_i‖ over all trainable parameters, (B,).
        clipping_coef: c_i = min(1, C / (‖∇ℓ_i‖ + 1e-6)), (B,).
    Note: a tapped output is a view; modifying it in place inside the model is refused by autograd.
    """

    def __init__(self, module: nn.Module, *, max_grad_norm: float) -> None:
        super().__init__()
        if max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm}")
        shared_parameters(module, "bk")
        check_bk_supported(module)
        self._module = module
        self.max_grad_norm = float(max_grad_norm)
        self._layers = trainable_owners(module)
        self.trainable_parameters = [getattr(m, n) for _, m, own in self._layers for n in own]
        if not self.trainable_parameters:
            raise ValueError("book-keeping clipping: the model has no trainable parameter")
        self._names = {id(m): name or "<root>" for name, m, _ in self._layers}
        self._n_own = {id(m): len(own) for _, m, own in self._layers}
        self._records: list[_Record] = []
        self._seen: set[int] = set()
        self._anchor: torch.Tensor | None = None
        self._active = False
        self._checked = False  # has a training forward run under the guard's op-level watch?
        self._handles = [m.register_forward_hook(self._capture) for _, m, _ in self._layers]
        # after the taps: the probe sees the tapped output, so its output gradient is the tap's
        self.probe = FirstStepProbe(module, "bk")
        self._handles += self.probe.handles + refuse_calls_in_backward(module, "bk")
        self.per_sample_gradient_norms: torch.Tensor | None = None
        self.clipping_coef: torch.Tensor | None = None

    def _capture(self, module: nn.Module, inputs: tuple, output):
        if not self._active:
            return None
        if id(module) in self._seen:
            raise RuntimeError(f"book-keeping clipping: trainable module '{self._names[id(module)]}' "
                               f"({type(module).__qualname__}) ran twice in one forward (parameter tying is not "
                               f"supported)")
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"book-keeping clipping: trainable module '{self._names[id(module)]}' returned "
                            f"{type(output).__qualname__}, expected one tensor")
        if self._anchor is None:
            self._anchor = torch.zeros((), dtype=output.dtype, device=output.device, requires_grad=True)
        rec = _Record(module, [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs])
        self._records.append(rec)
        self._seen.add(id(module))
        return _Tap.apply(output, self._anchor, rec)

    def forward(self, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return self._module(*args, **kwargs)
        live = [p for p in self.trainable_parameters if p.requires_grad]
        if len(live) != len(self.trainable_parameters):
            raise RuntimeError("book-keeping clipping: trainable parameters were frozen since wrapping; re-wrap")
        self._records, self._anchor, self._seen = [], None, set()
        # The guard's module hooks (keyword calls, no_grad, inputs without the batch first) run on every
        # training forward. Its op-level watch for a parameter used outside its module's forward runs on
        # the first (and on every probed one): in bk that use cannot escape the clip on any later forward,
        # since the parameters are detached and p.grad is only ever the rules' sum over the records whose
        # norms are clipped (tests/dp/test_foreign_hooks.py), so the watch only names a gradient that is
        # not the model's. It costs a Python call per op (a third of a tiny model's DP step).
        guard = ParameterUseGuard(self._module, mode="bk", batch=batch_size_of(args), layers=self._layers)
        probing = self.probe.start()
        if probing:  # the probe compares with autograd's parameter gradient: keep it
            live = []
        for p in live:  # autograd will not form parameter gradients: BK builds the clipped sum itself
            p.requires_grad_(False)
        self._active = True
        try:
            if self._checked and not probing:
                return self._module(*args, **kwargs)
            with guard:
                out = self._module(*args, **kwargs)
            self._checked = True
            return out
        finally:
            guard.remove()
            self.probe.stop()
            self._active = False
            for p in live:
                p.requires_grad_(True)

    def clipped_backward(self, losses: torch.Tensor) -> None:
        """One backward of Σ_i ℓ_i to the tapped layer outputs (norms computed on the way);
        the clipped sums Σ_i c_i ∇ℓ_i added to each trainable `p.grad` (trainable parameters the
        forward never reached get zeros).

        Args:
            losses: per-example losses of the last forward, (B,).
        """
        records, anchor = self._records, self._anchor
        self._records, self._anchor = [], None
        if not records:
            raise RuntimeError("book-keeping clipping: no trainable layer ran in training mode since the last "
                               "backward; call the wrapped module's forward first")
        if losses.dim() != 1:
            raise ValueError(f"book-keeping clipping needs per-example losses of shape (B,), got {tuple(losses.shape)}")
        if not losses.requires_grad:
            raise ValueError("book-keeping clipping: the losses do not depend on any trainable parameter")
        b = losses.shape[0]
        self.probe.check(losses, pause=self._pass_through(records))
        torch.autograd.backward(losses.sum(), inputs=[anchor])
        sq = torch.zeros(b, dtype=losses.dtype, device=losses.device)
        for rec in records:
            if rec.norms is None:  # the loss does not depend on this layer: zero gradient
                continue
            if rec.batch != b:
                raise ValueError(f"book-keeping clipping: module '{self._names[id(rec.module)]}' output has batch "
                                 f"{rec.batch}, losses have {b} (inputs must be batch first)")
            if len(rec.norms) != self._n_own[id(rec.module)]:
                raise RuntimeError(f"book-keeping clipping: the rule {BK_RULES[type(rec.module)].__name__} of module "
                                   f"'{self._names[id(rec.module)]}' covered {len(rec.norms)} of its "
                                   f"{self._n_own[id(rec.module)]} trainable parameters")
            for s in rec.norms.values():
                sq = sq + s.to(sq.dtype)
            rec.norms = None
        norm = sq.clamp(min=0).sqrt()
        coef = (self.max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        self.per_sample_gradient_norms, self.clipping_coef = norm, coef
        done = set()
        for rec in records:
            if rec.clip is None:
                continue
            for p, gsum in rec.clip(coef).items():
                if p.grad is None:
                    p.grad = gsum.to(p.dtype)
                else:  # e.g. zeroed (not None) by the optimizer's zero_grad
                    p.grad.add_(gsum.to(p.dtype))
                done.add(p)
            rec.clip = None
        for p in self.trainable_parameters:
            if p not in done and p.grad is None:
                p.grad = torch.zeros_like(p)

    @staticmethod
    @contextmanager
    def _pass_through(records: list[_Record]):
        """The taps pass gradients through untouched (the probe's backward)."""
        for rec in records:
            rec.passthrough = True
        try:
            yield
        finally:
            for rec in records:
                rec.passthrough = False

    def cleanup(self) -> None:
        """Remove the hooks; the wrapped model is left as it was."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._records, self._anchor = [], None

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_module":
                raise
            return getattr(self._module, name)
