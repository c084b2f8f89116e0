"""DP-SGD training of whatever parameters of a model are trainable, with Opacus'
PrivacyEngine and Poisson sampling, and four ways of clipping per-example gradients:

- "bk": book-keeping clipping (Bu et al. 2023, "Differentially Private Optimization on
  Large Model at Small Cost"): ONE backward pass to the trainable layers' outputs, the
  per-example norms from our per-layer rules, then Σ_i c_i ∇ℓ_i formed per layer from the
  recorded activations and the rescaled output gradients (`book_keeping`). Opacus'
  accountant and Poisson DPDataLoader (over row positions: each step reads only its rows) do the rest, with its fast-clipping DPOptimizer drawing
  the noise once per step over a flat buffer (`flat_noise`).
- "fast": ghost clipping with our norm samplers (Gram/direct Linear forms, vector fast
  path, LayerNorm and AdditiveDelta rules; Lee & Kifer 2021, "Scaling up differentially
  private deep learning with fast per-example gradient clipping"; Li et al. 2022 ghost
  clipping); every trainable module must be covered, else a clear error.
- "ghost": Opacus' own ghost clipping (its Linear sampler; other types materialise
  per-example gradients first).
- "hooks": Opacus' per-example gradients (Abadi et al. 2016, DP-SGD).
"fast" and "ghost" run two backward passes (norms, then the reweighted loss); all four give
the same clipped sum up to rounding. Every mode's first step is probed (`first_step_probe`: one
extra backward of one example's loss; the rebuilt-gradient and batch-attribution checks). Used for DP-TAFT (Liu & Soatto 2024, "Tangent
Transformers...", §3.4), DP-NLFT and DP-LAST.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from torch import nn
from torch.utils.data import DataLoader, Dataset

from pipeline_src.dp.book_keeping import BookKeepingModule
from pipeline_src.dp.budget import NEIGHBOURING, FastRdp, plan_budget, spent_epsilon, steps_per_epoch
from pipeline_src.dp.first_step_probe import FirstStepProbe
from pipeline_src.dp.flat_noise import FlatNoiseDPOptimizer
from pipeline_src.dp.frozen_modes import train_trainable_only
from pipeline_src.dp.norm_samplers import attach_fast_norm_samplers, check_fast_supported, check_opacus_supported
from pipeline_src.dp.parameter_use import (
    GuardForwards,
    foreign_hooks,
    refuse_calls_in_backward,
    shared_parameters,
    wrapper_hooks,
)
from pipeline_src.dp.secret_randomness import secret_generator
from pipeline_src.job.counters import counting
from pipeline_src.job.glibc_malloc import release_freed

MODES = ("bk", "fast", "ghost", "hooks")
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Rows = Any  # a view with `len` read at a tensor of positions: `CachedRows`, `StoredImages`


def per_example_cross_entropy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per example, shape (B,)."""
    return F.cross_entropy(outputs, labels, reduction="none")


def _per_example(losses: torch.Tensor, batch: int) -> torch.Tensor:
    if losses.shape != (batch,):
        raise ValueError(f"loss_fn must return one loss per example, shape ({batch},); got {tuple(losses.shape)}")
    return losses


def dp_backward(module: nn.Module, optimizer: torch.optim.Optimizer, losses: torch.Tensor, mode: str) -> None:
    """Backward pass(es) that leave clipped, summed per-example gradients for the DP optimizer.

    Args:
        module: the Opacus-wrapped model.
        optimizer: its DPOptimizer.
        losses: per-example losses, (B,).
        mode: "bk" (one pass), "fast" | "ghost" (two passes: norms, then Σ_i c_i ∇ℓ_i) or "hooks".
    """
    if mode == "bk":
        module.clipped_backward(losses)
        return
    probe = getattr(module, "first_step_probe", None)
    if probe is not None:  # first step (or new global hooks): one extra backward, Opacus' hooks paused
        probe.check(losses, pause=_opacus_hooks_paused(module))
    if mode in ("fast", "ghost"):
        DPTensorFastGradientClipping(module, optimizer, losses, "mean").backward()
    elif mode == "hooks":
        losses.mean().backward()
    else:
        raise ValueError(f"unknown DP mode {mode!r}; choose one of {MODES}")


@contextmanager
def _opacus_hooks_paused(module):
    module.disable_hooks()
    try:
        yield
    finally:
        module.enable_hooks()


def _watch_opacus_wrapper(module: nn.Module, model: nn.Module, mode: str) -> None:
    """The guards every training forward of an Opacus wrapper runs under (bk has its own): the
    parameter-use guard, in fast and ghost the hook re-check, the first-step probe
    (`first_step_probe`, run by `dp_backward`) and the refusal of calls in a backward pass; all
    removed by the wrapper's `cleanup`."""
    probe = FirstStepProbe(model, mode)  # registered after Opacus' hooks: it sees what they see
    handles = probe.handles + refuse_calls_in_backward(model, mode)
    guard = GuardForwards(module, model, mode=mode, allow_repeat=mode == "hooks", probe=probe,
                          hooks_from=wrapper_hooks(model) if mode in ("fast", "ghost") else None)
    module.first_step_probe = probe
    opacus_cleanup = module.cleanup

    def cleanup() -> None:
        for h in handles:
            h.remove()
        guard.remove()
        opacus_cleanup()
    module.cleanup = cleanup


def public_poisson_loader(loader: DataLoader, public_size: int, generator: torch.Generator) -> tuple[DataLoader, float]:
    """Poisson sampling of `loader.dataset` at the public rate q = 1/ceil(n̄/B) (`budget.steps_per_epoch`),
    and the public normaliser of each step, q·n̄: neither depends on the true size n.

    Args:
        loader: the non-private loader (its dataset and batch size B).
        public_size: the public dataset size n̄.
        generator: the (secret) sampling generator.
    """
    sample_rate = 1.0 / steps_per_epoch(public_size, loader.batch_size)
    dp_loader = DPDataLoader(loader.dataset, sample_rate=sample_rate, collate_fn=loader.collate_fn,
                             generator=generator)
    return dp_loader, public_size * sample_rate


def _make_private_bk(engine: PrivacyEngine, model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
                     *, sigma: float, max_grad_norm: float, noise_generator: torch.Generator | None,
                     public_size: int | None):
    """`PrivacyEngine.make_private` for grad_sample_mode="ghost" minus Opacus' model wrapping
    (whose hooks would do the norm work a second time): the same validation, Poisson
    DPDataLoader, DPOptimizerFastGradientClipping and accountant hook, in the same order."""
    model_params = set(model.parameters())
    if any(p not in model_params for g in optimizer.param_groups for p in g["params"]):
        raise ValueError("Module parameters are different than optimizer Parameters")
    engine.validate(module=model, optimizer=None, data_loader=None)
    module = BookKeepingModule(model, max_grad_norm=max_grad_norm)
    if public_size is None:
        dp_loader = engine._prepare_data_loader(loader, distributed=False, poisson_sampling=True, batch_first=True)
        sample_rate = 1 / len(dp_loader)
        expected_batch_size = int(len(dp_loader.dataset) * sample_rate)
    else:
        dp_loader, expected_batch_size = public_poisson_loader(loader, public_size, engine.secure_rng)
        sample_rate = dp_loader.sample_rate
    # Opacus' _prepare_optimizer for ghost mode builds DPOptimizerFastGradientClipping; ours draws the
    # noise once per step over a flat buffer (`flat_noise.py`), from the same generator.
    dp_opt = FlatNoiseDPOptimizer(optimizer=optimizer, noise_multiplier=sigma, max_grad_norm=max_grad_norm,
                                  expected_batch_size=expected_batch_size, loss_reduction="mean",
                                  generator=engine.secure_rng if engine.secure_mode else noise_generator,
                                  secure_mode=engine.secure_mode)
    dp_opt.attach_step_hook(engine.accountant.get_optimizer_hook_fn(sample_rate=sample_rate))
    return module, dp_opt, dp_loader


def make_private_model(model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader, *, mode: str,
                       sigma: float, max_grad_norm: float, accountant: str = "rdp",
                       noise_generator: torch.Generator | None = None,
                       sampler_generator: torch.Generator | None = None, public_size: int | None = None):
    """Opacus make_private in the chosen mode; returns (engine, module, optimizer, loader).

    Args:
        model: model with the trainable parameters already selected.
        optimizer: optimizer over those parameters.
        loader: non-private loader; replaced by Poisson sampling.
        mode: "bk", "fast", "ghost" or "hooks".
        sigma: noise multiplier.
        max_grad_norm: clipping bound C.
        accountant: "rdp" or "prv".
        noise_generator: generator of the Gaussian noise (default: a secret one on the model's device).
        sampler_generator: generator of the Poisson sampling (default: a secret CPU one); never
            the noise generator, and never the global one.
        public_size: the public dataset size n̄: the sampling rate is 1/ceil(n̄/B) and each step
            is normalised by q·n̄ (`public_poisson_loader`). None: Opacus' own, from the true size
            n (1/len(loader) and int(n·q)), which the released model then reveals.
    """
    if mode not in MODES:
        raise ValueError(f"unknown DP mode {mode!r}; choose one of {MODES}")
    shared_parameters(model, mode)
    if mode in ("fast", "ghost"):  # their norms assume the class's forward, unhooked
        foreign_hooks(model, mode)
    if mode == "fast":
        check_fast_supported(model)
    if mode in ("ghost", "hooks"):
        check_opacus_supported(model, mode)
    if noise_generator is None:
        noise_generator = secret_generator(next(model.parameters()).device)
    if sampler_generator is None:
        sampler_generator = secret_generator("cpu")
    if noise_generator is sampler_generator:
        raise ValueError("DP-SGD: the noise and the Poisson sampling must not share a generator (the noise "
                         "would reveal which samples were drawn)")
    engine = PrivacyEngine(accountant=accountant)
    engine.secure_rng = sampler_generator  # Opacus hands `secure_rng` to its Poisson DPDataLoader
    if mode == "bk":
        return (engine, *_make_private_bk(engine, model, optimizer, loader, sigma=sigma, max_grad_norm=max_grad_norm,
                                          noise_generator=noise_generator, public_size=public_size))
    expected_batch_size = None
    if public_size is not None:  # Opacus takes q = 1/len(loader), exact for q = 1/k; its normaliser is replaced
        loader, expected_batch_size = public_poisson_loader(loader, public_size, sampler_generator)
    out = engine.make_private(module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=sigma,
                              max_grad_norm=max_grad_norm, poisson_sampling=public_size is None,
                              noise_generator=noise_generator, grad_sample_mode="hooks" if mode == "hooks" else "ghost",
                              criterion=nn.CrossEntropyLoss())  # criterion unused: we pass per-example losses
    module, dp_opt, dp_loader = (out[0], out[1], out[3]) if mode != "hooks" else out
    if expected_batch_size is not None:
        dp_opt.expected_batch_size = expected_batch_size
    if mode == "fast":
        attach_fast_norm_samplers(module)
    # every training forward is watched for parameter use the clip cannot see (bk watches its own),
    # and in fast and ghost for hooks added since wrapping; the first step is probed
    _watch_opacus_wrapper(module, model, mode)
    return engine, module, dp_opt, dp_loader


class RowPositions(Dataset):
    """Positions 0..n-1 of a training set, as one-element tuples: the dataset Opacus' Poisson
    DPDataLoader samples from (each position independently with probability q, drawn from the
    secret sampler generator). The training loop then reads only those rows of its inputs, so a
    DP job holds one Poisson batch, never a tensor of its shard.

    Args:
        n: the training set's size.
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(f"position {i} out of range for {self.n} rows")
        return (torch.tensor(i, dtype=torch.int64),)


def read_rows(xs: list, positions: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    """The rows at `positions` of each input: a tensor's rows, or a view's (`CachedRows`,
    `StoredImages`: only those rows are read or computed), on `device`."""
    return [(t[positions.to(t.device)] if isinstance(t, torch.Tensor) else t[positions]).to(device) for t in xs]


def train_private(model: nn.Module, inputs: torch.Tensor | Sequence[torch.Tensor] | Rows, labels: torch.Tensor, *,
                  loss_fn: LossFn = per_example_cross_entropy,
                  epochs: int, batch_size: int, lr: float, epsilon: float, delta: float, max_grad_norm: float,
                  mode: str = "bk", accountant: str = "rdp",
                  progress: Callable[[dict], None] | None = None,
                  noise_generator: torch.Generator | None = None,
                  sampler_generator: torch.Generator | None = None,
                  public_size: int | None = None,
                  rdp: FastRdp | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """DP-SGD on the trainable parameters of `model` for a target (ε, δ).

    The noise and the Poisson sampling draw from two secret generators (`secret_randomness`):
    nothing recorded replays them, and the global generator is not touched.

    Args:
        model: model whose forward takes a batch of `inputs` (images or cached features);
            only parameters with requires_grad train (see `regimes.apply_regime`).
        inputs: (N, ...) tensor, a list of such tensors (e.g. LAST's [z_0..z_m]; passed to the
            model as a list of batch tensors), or a view with `len` read at a tensor of positions
            (`CachedRows`, `StoredImages`): each Poisson batch reads only its own rows.
        labels: (N, ...) tensor.
        loss_fn: per-example loss, (outputs, labels) -> (B,).
        epochs: planned epochs (sets σ with the sampling rate).
        batch_size: expected Poisson batch size.
        lr: SGD learning rate.
        epsilon: target ε.
        delta: target δ.
        max_grad_norm: clipping bound C.
        mode: "bk" (ours, one backward), "fast" (ours, two backwards), "ghost" or "hooks" (Opacus').
        accountant: "rdp" or "prv".
        progress: called after each step with {"step", "epoch", "loss", "batch"}.
        noise_generator, sampler_generator: for tests that compare modes on the same coins only;
            a release leaves both None (secret).
        public_size: the public dataset size n̄ the plan, the sampling rate and each step's
            normaliser use (`plan_budget`); None: the true size, which the model then reveals.
        rdp: a faster RDP accountant with Opacus' answers (`budget.FastRdp`) for the plan and the ε
            spent; None: Opacus'.
    Returns:
        (state dict of the trainable parameters, privacy record: the planned budget plus
        epsilon_spent from the engine's accountant, steps_taken, mode and the neighbouring relation).
    Raises:
        InfeasibleBudget: before any training, if the budget cannot be met.
    """
    as_list = isinstance(inputs, (list, tuple))
    xs = list(inputs) if as_list else [inputs]
    public = len(xs[0]) if public_size is None else int(public_size)
    budget = plan_budget(epsilon=epsilon, delta=delta, public_size=public, batch_size=batch_size,
                         epochs=epochs, max_grad_norm=max_grad_norm, accountant=accountant, rdp=rdp)
    if any(len(t) != len(labels) for t in xs):
        raise ValueError(f"inputs and labels differ in length: {[len(t) for t in xs]} vs {len(labels)}")
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("train_private: the model has no trainable parameter")
    device = trainable[0][1].device
    optimizer = torch.optim.SGD([p for _, p in trainable], lr=lr)
    # Opacus samples positions, not data: its Poisson loader over RowPositions draws each step's
    # rows with the secret sampler generator, and only those rows are read below.
    loader = DataLoader(RowPositions(len(labels)), batch_size=batch_size)
    engine, module, dp_opt, dp_loader = make_private_model(
        model, optimizer, loader, mode=mode, sigma=budget["sigma"], max_grad_norm=max_grad_norm,
        accountant=accountant, noise_generator=noise_generator, sampler_generator=sampler_generator,
        public_size=public)
    train_trainable_only(model)  # frozen modules (BatchNorm stem, drop-path) stay in eval mode
    step = 0
    try:
        for epoch in range(epochs):
            for (positions,) in dp_loader:
                n = len(positions)
                dp_opt.zero_grad()
                if n == 0:  # empty Poisson batch: noise-only step, still accounted
                    for _, p in trainable:
                        p.grad = torch.zeros_like(p)
                        p.summed_grad = torch.zeros_like(p) if mode != "hooks" else None
                        p.grad_sample = torch.zeros(0, *p.shape, dtype=p.dtype, device=p.device) if mode == "hooks" else None
                    loss_value = float("nan")
                else:
                    xb, yb = read_rows(xs, positions, device), labels[positions.to(labels.device)].to(device)
                    with counting("train", n, device):  # the efficiency table's FLOPs (observes only)
                        losses = _per_example(loss_fn(module(xb if as_list else xb[0]), yb), n)
                        dp_backward(module, dp_opt, losses, mode)
                    loss_value = float(losses.detach().mean())
                dp_opt.step()
                release_freed()  # the step's freed tensors leave the RSS (`job/glibc_malloc.py`)
                step += 1
                if progress is not None:
                    progress({"step": step, "epoch": epoch, "loss": loss_value, "batch": n})
        spent = spent_epsilon(engine.accountant, delta, rdp)
    finally:
        module.cleanup()
    state = {n: p.detach().clone() for n, p in trainable}
    record = {**budget, "epsilon_spent": spent, "steps_taken": step, "mode": mode,
              "neighbouring": NEIGHBOURING, "noise": "secret (OS CSPRNG seed, not recorded)"}
    return state, record
