"""Training the Δ of tangent models from cached prefix features, one shard or many at once.

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and
Removal", ICLR 2024. As in the authors' code: only Δw trains, AdamW with weight
decay 0, the model in eval mode, an L2 penalty on Δw (here squared, see
`losses.delta_l2_penalty`) or a projection onto a ball of radius R after each step.

`train_tangent_vectorized` trains N shard models in one process: Δ is stacked
along a leading shard axis and `torch.func.vmap(grad(...))` computes all N
gradients in one call; the loop, AdamW on the stacked tensors and the per-shard
batch schedules are `optim.stacked_training.train_stacked`.
Shards may differ in size: each shard keeps its own batch schedule (its own
seeded permutation, ceil(n_i / batch_size) steps per epoch, a short last batch),
batches are padded to `batch_size` with a 0/1 mask, and a shard with no batch
left in the current epoch is frozen for that step (no parameter, moment or
step-count update). This reproduces N separate `train_tangent` calls (tested in
float64). Memory grows like N × one shard's batch, since all N batches run at once.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn
from torch.func import functional_call, grad, vmap

from pipeline_src.job.counters import counting
from pipeline_src.optim.adamw import adamw
from pipeline_src.optim.schedule import apply_schedule
from pipeline_src.optim.stacked_training import check_data, member_seeds, stack_params, train_stacked
from pipeline_src.taft.jvp_layers import primal_grad_mode
from pipeline_src.taft.losses import add_l2_penalty_gradient_, delta_l2_penalty, get_loss, project_to_ball
from pipeline_src.taft.primal_gradient import primal_gradient_backward
from pipeline_src.vit.parts import FromPrefix


def tangent_step(model: nn.Module, opt: torch.optim.Optimizer, inputs: torch.Tensor, labels: torch.Tensor,
                 loss_fn: Callable, weight_decay_l2: float = 0.0, radius: Optional[float] = None,
                 from_images: bool = False, through_primal: bool = True,
                 params: Optional[list[nn.Parameter]] = None,
                 pairs: Optional[list[tuple[torch.Tensor, nn.Parameter]]] = None) -> float:
    """One optimizer step on a batch; returns the batch loss (data + penalty).

    Args:
        model: a TangentViT.
        opt: optimizer over its Δ parameters.
        inputs: prefix features (B, N, D), or images when `from_images`.
        labels: (B,) classes.
        loss_fn: `fn(logits, labels)` with mean reduction.
        weight_decay_l2: coefficient of ‖Δw‖₂².
        radius: project Δw onto this ball after the step (None: no projection).
        from_images: run the frozen prefix on `inputs` first.
        through_primal: take ∇_Δw as the primal network's backward (`primal_gradient`; the same
            gradient, cheaper); False: autograd through the tangent ops.
        params, pairs: `model.delta_parameters()` and `model.base_delta_parameters()`, looked up once
            per training run (None: at this step, where needed; the module walks cost 2-3 % of an
            epoch on the default study's ViT, `benchmarks/bench_taft_step.py --compare lookups`).
    """
    def loss_of() -> torch.Tensor:
        logits = model(inputs) if from_images else model.forward_from_prefix(inputs)
        return loss_fn(logits, labels)

    opt.zero_grad(set_to_none=True)
    if through_primal:
        loss = primal_gradient_backward(model, loss_of, pairs)
    else:
        loss = loss_of()
        loss.backward()
    if params is None and (weight_decay_l2 or radius is not None):
        params = model.delta_parameters()
    if weight_decay_l2:  # the penalty's gradient added directly (`add_l2_penalty_gradient_`)
        loss = loss.detach() + add_l2_penalty_gradient_(params, weight_decay_l2)
    opt.step()
    if radius is not None:
        project_to_ball(params, radius)
    return float(loss.detach())


def train_tangent(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, *, epochs: int, batch_size: int,
                  lr: float, weight_decay_l2: float = 0.0, loss: str = "rsl", alpha: Optional[float] = None,
                  kappa: Optional[float] = None, radius: Optional[float] = None, seed: int = 0,
                  progress: Optional[Callable[[int, float], None]] = None, schedule: Optional[dict] = None) -> dict:
    """Train the Δ of `model` in place from cached prefix features.

    Args:
        model: a TangentViT; put in eval mode; only its Δ parameters change.
        features: `model.prefix(x)` of the training set, (n, N, D): a tensor, or anything with `len` and
            `features[idx]` (`data.feature_cache.CachedRows` reads only a batch's cache rows).
        labels: (n,) classes.
        epochs: passes over the data.
        batch_size: samples per step; the last batch of an epoch may be shorter.
        lr: AdamW learning rate (weight decay 0).
        weight_decay_l2: coefficient of ‖Δw‖₂² added to the loss.
        loss: 'rsl', 'mse' or 'ce'.
        alpha: RSL α (None: 1).
        kappa: RSL κ (None: 15).
        radius: project Δw onto the ball of this radius after each step.
        seed: seed of the torch.Generator that shuffles each epoch.
        progress: called as progress(epoch, mean_loss) after each epoch.
        schedule: `train.schedule` (`optim/schedule.py`), per optimizer step; None: constant lr.

    Returns:
        {"delta_state_dict", "loss_history" (per-epoch sample-weighted mean), "steps", "epochs", "n_samples"}.
    """
    n = check_data(features, labels, batch_size)
    model.eval()
    params, pairs = model.delta_parameters(), model.base_delta_parameters()
    device, dtype = params[0].device, params[0].dtype
    opt = adamw(params, lr=lr, weight_decay=0.0)
    loss_fn = get_loss(loss, alpha, kappa)
    gen = torch.Generator().manual_seed(seed)
    history, steps = [], 0
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=gen)
        total = 0.0
        for start in range(0, n, batch_size):
            idx = perm[start:start + batch_size]
            h = features[idx].to(device=device, dtype=dtype)
            y = labels[idx].to(device)
            apply_schedule(opt, lr, schedule, steps, -(-n // batch_size), epochs * -(-n // batch_size))
            with counting("train", len(idx), device, memory=True):
                total += tangent_step(model, opt, h, y, loss_fn, weight_decay_l2, radius,
                                      params=params, pairs=pairs) * len(idx)
            steps += 1
        history.append(total / n)
        if progress is not None:
            progress(epoch, history[-1])
    return {"delta_state_dict": model.delta_state_dict(), "loss_history": history, "steps": steps,
            "epochs": epochs, "n_samples": n}


def train_tangent_vectorized(model: nn.Module, shards: Sequence[tuple[torch.Tensor, torch.Tensor]], *, epochs: int,
                             batch_size: int, lr: float, weight_decay_l2: float = 0.0, loss: str = "rsl",
                             alpha: Optional[float] = None, kappa: Optional[float] = None,
                             radius: Optional[float] = None, seed: "int | Sequence[int]" = 0,
                             progress: Optional[Callable[[int, list[float]], None]] = None,
                             schedule: Optional[dict] = None, through_primal: bool = True) -> list[dict]:
    """Train one Δ per shard, all shards in one vmapped computation; `model` is not modified.

    Each shard starts from the model's current Δ and gets the result of
    `train_tangent(copy_of_model, *shards[i], seed=seeds[i], ...)` (see module docstring).

    Args:
        model: a TangentViT (the shared linearization point and initial Δ).
        shards: (features (n_i, N, D), labels (n_i,)) per shard; n_i may differ; features as in
            `train_tangent` (a tensor or `CachedRows`).
        epochs, batch_size, lr, weight_decay_l2, loss, alpha, kappa, radius, schedule: as in `train_tangent`
            (each shard's schedule follows its own steps).
        seed: one shuffling seed for all shards, or one per shard.
        progress: called as progress(epoch, per-shard mean losses) after each epoch.
        through_primal: ∇_Δw as the primal network's gradient w.r.t. the shared base weights
            (`primal_gradient`), per shard; False: through the tangent ops.

    Returns:
        One dict per shard, as `train_tangent` returns.
    """
    S = len(shards)
    seeds = member_seeds(seed, S)
    model.eval()
    named = model.named_delta_parameters()
    params = stack_params([(f"tuned.{n}", p) for n, p in named], S)  # stacked Δ: (S, *shape) per parameter
    loss_fn = get_loss(loss, alpha, kappa)
    grad_fn = stacked_gradients(model, loss_fn, weight_decay_l2, through_primal)
    project = None if radius is None else (lambda p, active: _project_stacked_(p, radius, active))
    out = train_stacked(params, grad_fn, shards, epochs=epochs, batch_size=batch_size, lr=lr, seeds=seeds,
                        schedule=schedule, project=project, progress=progress)
    return [{"delta_state_dict": {n[len("tuned."):]: p[i].clone() for n, p in params.items()},
             "loss_history": out["histories"][i], "steps": out["steps_per_epoch"][i] * epochs, "epochs": epochs,
             "n_samples": out["sizes"][i]} for i in range(S)]


def stacked_gradients(model: nn.Module, loss_fn: Callable, weight_decay_l2: float = 0.0,
                      through_primal: bool = True) -> Callable:
    """`fn(params, h, y, mask) -> (grads, losses)`: per-shard ∇ of the masked mean loss (+ the L2
    penalty) w.r.t. stacked Δ `params` ({"tuned.<Δ name>": (S, ...)}), batches h (S, b, N, D),
    y (S, b), mask (S, b), in one `vmap(grad(...))` call.

    Args:
        model: a TangentViT (its Δ parameters are replaced by `params`).
        loss_fn: `fn(logits, labels, reduction)`.
        weight_decay_l2: coefficient of ‖Δw‖₂².
        through_primal: ∇ as the primal network's gradient w.r.t. the shared base weights
            (`primal_gradient`); False: through the tangent ops.
    """
    wrapper = FromPrefix(model)
    delta_keys = {f"tuned.{n}" for n, _ in model.named_delta_parameters()}

    def shard_loss(p: dict, h: torch.Tensor, y: torch.Tensor, mask: torch.Tensor):
        per = loss_fn(functional_call(wrapper, p, (h,)), y, reduction="none")  # (batch,)
        total = (per * mask).sum() / mask.sum().clamp(min=1)
        if weight_decay_l2:
            total = total + weight_decay_l2 * delta_l2_penalty(v for k, v in p.items() if k in delta_keys)
        return total, total.detach()

    # ∇ w.r.t. the base tensors (shared: in_dims None) is ∇ w.r.t. Δ of the data loss; the Δ
    # argument's own gradient is the penalty's (the tangent ops run without autograd).
    base_names = [(f"tuned.{b}", f"tuned.{d}") for b, d in model.base_delta_names()]
    base = {b: model.get_buffer(b[len("tuned."):]).detach() for b, _ in base_names}

    def shard_loss_primal(wb: dict, p: dict, h: torch.Tensor, y: torch.Tensor, mask: torch.Tensor):
        with primal_grad_mode(vmapped=True):
            return shard_loss({**p, **wb}, h, y, mask)

    primal_grad_fn = vmap(grad(shard_loss_primal, argnums=(0, 1), has_aux=True), in_dims=(None, 0, 0, 0, 0))

    def grad_fn(params: dict, h: torch.Tensor, y: torch.Tensor, mask: torch.Tensor):
        if not through_primal:
            return vmap(grad(shard_loss, has_aux=True))(params, h, y, mask)
        (g_base, g_delta), losses = primal_grad_fn(base, params, h, y, mask)
        for b, d in base_names:
            g_delta[d] = g_delta[d] + g_base[b].reshape(g_delta[d].shape)
        return g_delta, losses

    return grad_fn


@torch.no_grad()
def _project_stacked_(params: dict, radius: float, active: torch.Tensor) -> None:
    """Per-shard projection of the stacked Δ onto the ball of `radius` (active shards only)."""
    sq = sum(p.square().flatten(1).sum(1) for p in params.values())  # (S,)
    norm = sq.sqrt()
    scale = torch.where(active & (norm > radius), radius / norm.clamp(min=1e-300), torch.ones_like(norm))
    for n, p in params.items():
        params[n] = p * scale.view((-1,) + (1,) * (p.dim() - 1))
