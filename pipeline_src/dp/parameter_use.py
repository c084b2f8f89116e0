"""Guards on how a model uses its trainable parameters, for every DP clipping mode.

Every per-example norm in this package (book-keeping, fast and ghost clipping, and Opacus'
hooks) sees a parameter only through its owning module: the module's inputs and its output
gradient. A parameter that reaches the loss any other way escapes the clip:
- used outside its owner's forward (a parent computing `x @ self.child.weight.T`): its
  contribution is added to the gradient but never to the norm, so one example can move the
  model by more than C (measured 0.069 against C = 0.05 in fast mode);
- shared by two modules (tied weights): each module clips its own share;
- a module run twice in one forward: the squared norms of the two calls are added, but
  ‖g₁ + g₂‖² ≠ ‖g₁‖² + ‖g₂‖². Opacus' hooks sum the two calls' per-example gradients before
  the norm, so only the norm-only modes (bk, fast, ghost) refuse it.

- a forward hook, pre-hook or instance-level `forward` override on a module that holds a
  trainable parameter: fast and ghost clipping compute the norm from the module's inputs and
  output gradient as the class's forward defines them; a hook that reuses the weight (a LayerNorm
  hook multiplying by its weight: 0.0527 against C = 0.05) or a patched forward that uses it
  twice (0.0912) escapes it. `foreign_hooks` refuses them (fast and ghost), before wrapping and
  again at every forward.

- a trainable module fed something other than the batch first (no batch dimension, or a table
  whose first dimension is not B), called with tensor keyword arguments (the records hold
  positional inputs only), or run with gradients disabled inside a training forward or inside a
  backward pass (activation checkpointing recomputes it there).

`shared_parameters` and `foreign_hooks` are static checks; `ParameterUseGuard` watches one real
forward, `GuardForwards` runs every training forward of Opacus' modes under one (a parent may start
using a child's weight at any forward, e.g. from its second on), and `refuse_calls_in_backward` stays
on for the whole job. Book-keeping runs the guard's module hooks on every forward but its op-level
watch on the first only: there a use outside the module reaches no gradient (`book_keeping`). These
are the cheap named refusals; what no pattern names (a global hook returning a value, a view of a
weight made outside the forward, a batch-free table with B rows) is caught by the first step's
probe (`first_step_probe`).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


class ParameterUseError(NotImplementedError):
    """A trainable parameter is used in a way the DP mode cannot clip."""


def trainable_owners(model: nn.Module) -> list[tuple[str, nn.Module, list[str]]]:
    """(module path, module, names of its own trainable parameters) for every module owning one."""
    out = []
    for name, m in model.named_modules():  # each module once, under its first path
        own = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
        if own:
            out.append((name, m, own))
    return out


def shared_parameters(model: nn.Module, mode: str) -> None:
    """Refuse a trainable parameter held by two modules, or twice by one (tied weights).

    Args:
        model: the model about to be wrapped.
        mode: the DP mode, named in the error.
    Raises:
        ParameterUseError: naming both places that hold the parameter.
    """
    seen: dict[int, tuple[str, int, str]] = {}  # id(param) -> (path, id(owner), attribute name)
    for name, m in model.named_modules():  # one module reached by two paths is a repeat, not a tie
        for pname, p in m._parameters.items():
            if p is None or not p.requires_grad:
                continue
            path = f"{name}.{pname}" if name else pname
            first = seen.setdefault(id(p), (path, id(m), pname))
            if first[1:] != (id(m), pname):
                raise ParameterUseError(
                    f"DP mode {mode!r}: trainable parameter '{first[0]}' is shared with '{path}' (tied weights); "
                    f"per-example norms would be taken per module, not per parameter. Untie or freeze it")


def _hook_ids(m: nn.Module) -> set[tuple[str, int]]:
    return {(kind, k) for kind in ("_forward_hooks", "_forward_pre_hooks") for k in getattr(m, kind)}


def foreign_hooks(model: nn.Module, mode: str, allowed: set[tuple[int, str, int]] = frozenset(),
                  layers: list[tuple[str, nn.Module, list[str]]] | None = None) -> None:
    """Refuse forward hooks, pre-hooks and instance-level `forward` overrides on the modules that
    hold a trainable parameter (fast and ghost clipping). Global module hooks are not refused here:
    tools that observe a run register them (torch's `FlopCounterMode` and its module tracker, say); one
    that returns a value or uses a weight is caught by the first-step probe (`first_step_probe`).

    Args:
        model: the model (before wrapping: every hook on it is foreign).
        mode: the DP mode, named in the error.
        allowed: (id(module), hook table, hook id) of the hooks the DP wrapper registered itself.
        layers: `trainable_owners(model)`, if the caller has it (None: walked here).
    Raises:
        ParameterUseError: naming the module, its trainable parameters and the hook.
    """
    for name, m, own in trainable_owners(model) if layers is None else layers:
        where = f"module '{name or '<root>'}' ({type(m).__qualname__}, trainable parameters {own})"
        if "forward" in m.__dict__:
            raise ParameterUseError(f"DP mode {mode!r}: {where} has an instance-level `forward` override; the "
                                    f"per-example norm assumes the class's forward. Subclass it instead, or use "
                                    f"mode='hooks'/'bk'")
        for kind, k in _hook_ids(m):
            if (id(m), kind, k) not in allowed:
                hook = getattr(m, kind)[k]
                raise ParameterUseError(
                    f"DP mode {mode!r}: {where} has a {kind.strip('_').replace('_', ' ')[:-1]} "
                    f"{getattr(hook, '__qualname__', hook)!s} the DP wrapper did not register; it could use the "
                    f"parameter where the per-example norm does not see it. Remove it, or use mode='hooks'/'bk'")


def wrapper_hooks(model: nn.Module) -> set[tuple[int, str, int]]:
    """The hooks on `model`'s trainable modules now (after wrapping: the wrapper's own)."""
    return {(id(m), kind, k) for _, m, _ in trainable_owners(model) for kind, k in _hook_ids(m)}


def batch_size_of(args: tuple) -> int | None:
    """The batch size of a forward's arguments: the first dimension of its first tensor (the first
    argument, or the first element of a list of batch tensors such as LAST's [z_0..z_m])."""
    x = args[0] if args else None
    if isinstance(x, (list, tuple)) and x:
        x = x[0]
    return x.shape[0] if isinstance(x, torch.Tensor) and x.dim() > 0 else None


class ParameterUseGuard(TorchFunctionMode):
    """Fails a forward in which a trainable parameter feeds an op outside its own module's
    forward, or (unless `allow_repeat`) a trainable module runs twice.

    Use as a context manager around one training forward of the (wrapped) model.

    Args:
        model: the unwrapped model (its trainable parameters are fixed here).
        mode: the DP mode, named in errors.
        allow_repeat: accept a trainable module called more than once (Opacus' hooks mode).
        batch: the forward's batch size (its input's first dimension): a trainable module's input
            must have it first; None: only inputs without any batch dimension are refused.
        layers: `trainable_owners(model)` computed once by the wrapper (the trainable set is fixed
            at wrapping), so a forward does not walk the model again; None: walked here.
    """

    def __init__(self, model: nn.Module, *, mode: str, allow_repeat: bool = False, batch: int | None = None,
                 layers: list[tuple[str, nn.Module, list[str]]] | None = None) -> None:
        super().__init__()
        self.mode, self.allow_repeat, self.batch = mode, allow_repeat, batch
        layers = trainable_owners(model) if layers is None else layers
        self._owner = {id(getattr(m, n)): (name or "<root>", m, n) for name, m, own in layers for n in own}
        self._names = {id(m): name or "<root>" for name, m, _ in layers}
        self._own = {id(m): own for _, m, own in layers}
        self._running: list[nn.Module] = []
        self._calls: set[int] = set()
        self._handles = []
        for _, m, _ in layers:
            self._handles.append(m.register_forward_pre_hook(self._enter, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._leave, always_call=True))

    def _enter(self, module: nn.Module, inputs: tuple, kwargs: dict) -> None:
        where = f"trainable parameter '{self._names[id(module)]}.{self._own[id(module)][0]}' ({type(module).__qualname__})"
        keyword = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        if keyword:  # every mode's hooks record the positional inputs only
            raise ParameterUseError(
                f"DP mode {self.mode!r}: {where} is called with tensor keyword arguments {keyword}; the per-example "
                f"norms record a module's positional inputs only. Call it as module(x)")
        if not torch.is_grad_enabled():
            raise ParameterUseError(
                f"DP mode {self.mode!r}: {where} runs with gradients disabled inside a training forward (torch.no_grad, "
                f"or activation checkpointing, which recomputes it in the backward pass where no mode's records "
                f"can follow it). Remove the checkpointing or no_grad around trainable modules")
        x = inputs[0] if inputs else None
        if isinstance(x, torch.Tensor) and (x.dim() == 0 or (isinstance(module, nn.Linear) and x.dim() < 2)
                                            or (self.batch is not None and x.shape[0] != self.batch)):
            raise ParameterUseError(  # (reading requires_grad here would re-enter __torch_function__)
                f"DP mode {self.mode!r}: {where} is applied to an input of shape {tuple(x.shape)}, without a batch "
                f"dimension (the batch has {self.batch} examples, first); per-example gradients need one example "
                f"per row. Apply it to the batch")
        if id(module) in self._calls and not self.allow_repeat:
            raise ParameterUseError(
                f"DP mode {self.mode!r}: trainable module '{self._names[id(module)]}' ({type(module).__qualname__}) "
                f"ran twice in one forward; its per-example norm would be the sum of the calls' norms, not the "
                f"norm of their sum. Use separate modules, freeze it, or use mode='hooks'")
        self._calls.add(id(module))
        self._running.append(module)

    def _leave(self, _module: nn.Module, _inputs, _output) -> None:  # returns None: the output is kept
        self._running.pop()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in (*args, *kwargs.values()):
            for x in (t if isinstance(t, (list, tuple)) else (t,)):
                owner, view = self._owner.get(id(x)), ""
                if owner is None and isinstance(x, torch.Tensor) and x._base is not None:
                    owner, view = self._owner.get(id(x._base)), " through a view"  # `weight.T` made in __init__
                if owner is not None and not any(m is owner[1] for m in self._running):
                    raise ParameterUseError(
                        f"DP mode {self.mode!r}: trainable parameter '{owner[0]}.{owner[2]}' is used outside its "
                        f"module's forward{view} (by {getattr(func, '__name__', func)}); its share of each example's "
                        f"gradient would escape the clip. Call the module instead, or freeze the parameter")
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.remove()

    def remove(self) -> None:
        """Remove the module hooks (also done on leaving the context)."""
        for h in self._handles:
            h.remove()
        self._handles = []


def refuse_calls_in_backward(model: nn.Module, mode: str) -> list:
    """Forward pre-hooks, kept for the whole job, that refuse a trainable module run inside a backward
    pass: activation checkpointing (`torch.utils.checkpoint`, reentrant or not) recomputes a block
    there, where no mode's records can follow it (Opacus sees the call twice, "Parameter tying is not
    supported"; book-keeping's taps are missing from the recomputed graph, CheckpointError or a zero
    gradient).

    Args:
        model: the unwrapped model.
        mode: the DP mode, named in errors.
    Returns:
        the hook handles (remove them with the wrapper).
    """
    def refuse(module: nn.Module, _inputs) -> None:
        if torch._C._current_graph_task_id() != -1:
            name = next(n for n, m in model.named_modules() if m is module)
            raise ParameterUseError(
                f"DP mode {mode!r}: trainable module '{name or '<root>'}' ({type(module).__qualname__}) runs inside a "
                f"backward pass (activation checkpointing recomputes it there); its per-example norm cannot follow the "
                f"recomputation. Remove the checkpointing around trainable modules")
    return [m.register_forward_pre_hook(refuse) for _, m, _ in trainable_owners(model)]


class GuardForwards:
    """Runs every training forward of `wrapper` under a `ParameterUseGuard` of `model` (a model
    may change how it uses a parameter between forwards: a parent can start using a child's
    weight from its second forward on); with `hooks_from`, each forward first re-checks the
    trainable modules for hooks and `forward` overrides added since wrapping (`foreign_hooks`).

    Args:
        wrapper: the module whose forward is called in training (an Opacus wrapper, or the model).
        model: the unwrapped model.
        mode: the DP mode, named in errors.
        allow_repeat: see `ParameterUseGuard`.
        hooks_from: the hooks the wrapper registered (`wrapper_hooks`); None: no hook check.
        probe: a `first_step_probe.FirstStepProbe`, started and stopped around each training forward.
    """

    def __init__(self, wrapper: nn.Module, model: nn.Module, *, mode: str, allow_repeat: bool = False,
                 hooks_from: set[tuple[int, str, int]] | None = None, probe=None) -> None:
        self._model, self._mode, self._allow_repeat, self._allowed = model, mode, allow_repeat, hooks_from
        self._layers = trainable_owners(model)  # the trainable set is fixed at wrapping
        self._probe = probe
        self._guard: ParameterUseGuard | None = None
        self.checked = 0  # training forwards run under the guard
        self._handles = [wrapper.register_forward_pre_hook(self._enter),
                         wrapper.register_forward_hook(self._leave, always_call=True)]

    def _enter(self, wrapper: nn.Module, inputs: tuple) -> None:
        if not (wrapper.training and torch.is_grad_enabled()):
            return
        if self._allowed is not None:
            foreign_hooks(self._model, self._mode, self._allowed, self._layers)
        self._guard = ParameterUseGuard(self._model, mode=self._mode, allow_repeat=self._allow_repeat,
                                        batch=batch_size_of(inputs), layers=self._layers)
        if self._probe is not None:
            self._probe.start()
        self._guard.__enter__()

    def _leave(self, _wrapper: nn.Module, _inputs, _output) -> None:
        if self._guard is None:
            return
        guard, self._guard = self._guard, None
        if self._probe is not None:
            self._probe.stop()
        guard.__exit__(None, None, None)
        self.checked += 1

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
