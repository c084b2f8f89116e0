"""Full-batch DP gradient descent: the DP protocol of the TAFT paper (Liu, Soatto et al.,
"Tangent Transformers for Composition, Privacy and Removal", ICLR 2024, App. A: "Gradients at
each epoch are also aggregated over the entire dataset").

Each epoch is ONE noisy step over the whole shard (sampling rate q = 1, no subsampling):

    g = (Σ_i clip_C(∇ℓ_i) + N(0, σ²C²·I)) / n̄,    w ← w − lr·g

where n̄ is a public size (`public_size`), never the true n: dividing by n would release it.

The clipped sum is accumulated over micro-batches (book-keeping clipping, `book_keeping`), so
memory is bounded by the micro-batch, not the shard. With q = 1 the T steps compose T Gaussian
mechanisms of sensitivity C; Opacus' RDP accountant (Mironov 2017, "Rényi Differential
Privacy") is exact for this case (RDP α/(2σ²) per step) and sets σ and reports ε.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from opacus.accountants import create_accountant
from torch import nn

from pipeline_src.dp.book_keeping import BookKeepingModule
from pipeline_src.dp.budget import NEIGHBOURING, plan_budget
from pipeline_src.dp.frozen_modes import train_trainable_only
from pipeline_src.dp.secret_randomness import secret_generator
from pipeline_src.job.counters import counting

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
FULL_BATCH_MODES = ("bk",)


def _micro_batches(xs: list[torch.Tensor], labels: torch.Tensor, size: int, device: torch.device):
    for start in range(0, len(labels), size):
        yield [t[start:start + size].to(device) for t in xs], labels[start:start + size].to(device)


def clipped_gradient_sum(module: BookKeepingModule, xs: list[torch.Tensor], labels: torch.Tensor, *,
                         loss_fn: LossFn, micro_batch_size: int, as_list: bool) -> float:
    """Σ_i clip_C(∇ℓ_i) over the whole data set, left in each trainable `p.grad` (which must be
    None or zero on entry); micro-batches of `micro_batch_size` bound the memory.

    Args:
        module: the model wrapped for book-keeping clipping (bound C).
        xs: the inputs, a list of (N, ...) tensors or sliceable views (one unless `as_list`).
        labels: (N,) labels.
        loss_fn: per-example loss, (outputs, labels) -> (B,).
        micro_batch_size: examples per forward/backward.
        as_list: pass the model a list of batch tensors (LAST's [z_0..z_m]) instead of xs[0].
    Returns:
        the mean loss over the data set (before the step).
    """
    device = module.trainable_parameters[0].device
    total = 0.0
    for xb, yb in _micro_batches(xs, labels, micro_batch_size, device):
        with counting("train", len(yb), device):  # the efficiency table's FLOPs (observes only)
            losses = loss_fn(module(xb if as_list else xb[0]), yb)
            if losses.shape != (len(yb),):
                raise ValueError(f"loss_fn must return one loss per example, shape ({len(yb)},); "
                                 f"got {tuple(losses.shape)}")
            module.clipped_backward(losses)
        total += float(losses.detach().sum())
    return total / len(labels)


def train_private_full_batch(model: nn.Module, inputs: torch.Tensor | Sequence[torch.Tensor], labels: torch.Tensor,
                             *, loss_fn: LossFn, epochs: int, micro_batch_size: int, lr: float, epsilon: float,
                             delta: float, max_grad_norm: float, mode: str = "bk", accountant: str = "rdp",
                             progress: Callable[[dict], None] | None = None,
                             noise_generator: torch.Generator | None = None,
                             public_size: int | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Full-batch DP-GD (q = 1, one noisy step per epoch) on the trainable parameters of `model`.

    Args:
        model: model whose forward takes a batch of `inputs`; only requires_grad parameters train.
        inputs: (N, ...) tensor, a list of such tensors passed to the model as a list, or a view
            sliced one micro-batch at a time (`CachedRows`, `StoredImages`: only its rows are read).
        labels: (N,) labels.
        loss_fn: per-example loss, (outputs, labels) -> (B,).
        epochs: epochs = noisy steps (the paper: 50).
        micro_batch_size: examples per forward/backward of the clipped sum (memory only; the
            step always covers the whole set).
        lr: gradient-descent learning rate, constant (the paper: no decay).
        epsilon, delta: target budget.
        max_grad_norm: clipping bound C.
        mode: per-example clipping; "bk" only (the micro-batch sums accumulate in `p.grad`).
        accountant: "rdp" or "prv" (Opacus), with sample rate 1.
        progress: called after each step with {"step", "epoch", "loss", "batch"}.
        noise_generator: for tests only; a release leaves it None (secret, `secret_randomness`).
        public_size: the public size n̄ that normalises each step (and bounds δ); None: the true
            size n, which the model then reveals.
    Returns:
        (state dict of the trainable parameters, privacy record as `train_private`'s, with
        protocol "full-batch", sample_rate 1 and steps = epochs).
    Raises:
        InfeasibleBudget: before any training, if the budget cannot be met.
        ValueError: a mode other than "bk", or inputs and labels of different lengths.
    """
    if mode not in FULL_BATCH_MODES:
        raise ValueError(f"full-batch DP-GD accumulates book-keeping clipped sums over micro-batches; DP mode "
                         f"{mode!r} is not supported (use one of {FULL_BATCH_MODES})")
    as_list = isinstance(inputs, (list, tuple))
    xs = list(inputs) if as_list else [inputs]
    if any(len(t) != len(labels) for t in xs):
        raise ValueError(f"inputs and labels differ in length: {[len(t) for t in xs]} vs {len(labels)}")
    n = len(labels)
    public = n if public_size is None else int(public_size)
    budget = plan_budget(epsilon=epsilon, delta=delta, public_size=public, batch_size=micro_batch_size, epochs=epochs,
                         max_grad_norm=max_grad_norm, accountant=accountant, full_batch=True)
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("train_private_full_batch: the model has no trainable parameter")
    device = trainable[0][1].device
    if noise_generator is None:
        noise_generator = secret_generator(device)
    sigma, c = budget["sigma"], float(max_grad_norm)
    optimizer = torch.optim.SGD([p for _, p in trainable], lr=lr)
    acc = create_accountant(mechanism=accountant)
    module = BookKeepingModule(model, max_grad_norm=c)
    train_trainable_only(model)  # frozen modules (BatchNorm stem, drop-path) stay in eval mode
    try:
        for epoch in range(epochs):
            optimizer.zero_grad(set_to_none=True)
            loss = clipped_gradient_sum(module, xs, labels, loss_fn=loss_fn, micro_batch_size=micro_batch_size,
                                        as_list=as_list)
            for _, p in trainable:
                noise = torch.normal(0.0, sigma * c, size=p.shape, generator=noise_generator, device=p.device,
                                     dtype=p.dtype)
                p.grad = (p.grad + noise) / public  # a public normaliser: q·n̄ with q = 1
            optimizer.step()
            acc.step(noise_multiplier=sigma, sample_rate=1.0)
            if progress is not None:
                progress({"step": epoch + 1, "epoch": epoch, "loss": loss, "batch": n})  # private: the job's log only
        spent = float(acc.get_epsilon(delta=delta))
    finally:
        module.cleanup()
        optimizer.zero_grad(set_to_none=True)
    state = {name: p.detach().clone() for name, p in trainable}
    record = {**budget, "epsilon_spent": spent, "steps_taken": epochs, "mode": mode, "protocol": "full-batch",
              "micro_batch_size": micro_batch_size, "neighbouring": NEIGHBOURING,
              "noise": "secret (OS CSPRNG seed, not recorded)"}
    return state, record
