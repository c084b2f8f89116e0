"""RegMean: merge each Linear layer by the closed-form solution of a joint regression.

Jin et al., "Dataless Knowledge Fusion by Merging Weights of Language Models", ICLR 2023.
For a Linear layer with weights W_i (out, in) in model i and Gram matrix G_i = X_iᵀ·X_i of its
inputs in model i (on model i's own data),

    W* = argmin_W Σ_i ‖X_i·Wᵀ − X_i·W_iᵀ‖²  =  ((Σ_i G_i)⁻¹ · Σ_i G_i·W_iᵀ)ᵀ.

RegMean shrinks each G_i's off-diagonal entries by α (G̃ = α·G + (1 − α)·diag(G); default
α = 0.9), which regularises towards the plain average. All other parameters are averaged.

Here the Grams are of *augmented* inputs [x, 1] ((in+1)×(in+1); the last diagonal entry is
the number of rows), so a Linear's bias can be solved jointly with its weight (`merge_bias=True`,
the exact least-squares answer) or averaged as in the original paper (`merge_bias=False`, the
default). Note that the augmented Gram of a Linear fed by a LayerNorm (qkv, fc1, the head) is
always singular (LN outputs lie in an affine hyperplane), so `merge_bias=True` needs alpha < 1.
When models are matched before merging, compute the Grams on the matched models (a
rotation or permutation changes the inputs of `proj` and `fc2`).
"""
from __future__ import annotations

import torch
from torch import nn

from pipeline_src.fusion.soup import check_same_keys, weighted_average
from pipeline_src.job.glibc_malloc import release_freed


def linear_input_grams(model: nn.Module, inputs: torch.Tensor, batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Gram matrices of every nn.Linear's augmented inputs [x, 1], summed over all rows/tokens.

    Args:
        model: evaluated in eval mode under no_grad (mode restored after).
        inputs: (N, ...) examples, fed in chunks of `batch_size`: a tensor, or any view with `len` that
            returns a batch tensor when sliced (`CachedRows`, `StoredImages`); each Gram is summed
            batch by batch in float64, so only one batch of inputs is held.
        batch_size: examples per forward.

    Returns:
        {module name: (in+1, in+1) float64 Gram}; a Linear called twice accumulates both calls.
    """
    grams: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def fn(module: nn.Linear, args: tuple) -> None:
            x = args[0].detach().reshape(-1, module.in_features).double()  # (rows, in)
            xa = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)  # (rows, in+1)
            g = xa.T @ xa
            grams[name] = grams[name] + g if name in grams else g
        return fn

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not handles:
        raise ValueError("regmean: the model has no nn.Linear layers")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(inputs), batch_size):
                model(inputs[start:start + batch_size])
                release_freed()  # the batch's freed tensors leave the RSS (`job/glibc_malloc.py`)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return grams


def regmean_merge(sds: list[dict], grams: list[dict[str, torch.Tensor]], alpha: float = 0.9,
                  merge_bias: bool = False) -> dict:
    """RegMean merge of state dicts; Linear layers named in the Grams are solved in closed form.

    Args:
        sds: state dicts to merge (matched first if they come from different inits).
        grams: one `linear_input_grams` result per state dict, all with the same names.
        alpha: off-diagonal scaling in [0, 1] (1 = exact regression, 0 = per-input-weighted mean).
        merge_bias: solve each Linear's bias jointly with its weight; else average it (paper).
    """
    check_same_keys(sds, "regmean")
    if len(grams) != len(sds):
        raise ValueError(f"regmean: {len(grams)} Gram sets for {len(sds)} state dicts")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"regmean: alpha={alpha} must be in [0, 1]")
    names = set(grams[0])
    if any(set(g) != names for g in grams):
        raise ValueError("regmean: Gram sets name different Linear layers")
    solved: dict[str, torch.Tensor] = {}
    for name in sorted(names):
        wkey, bkey = f"{name}.weight", f"{name}.bias"
        if wkey not in sds[0]:
            raise KeyError(f"regmean: Gram for '{name}' but no '{wkey}' in the state dicts")
        ref = sds[0][wkey]
        use_bias = merge_bias and bkey in sds[0]
        lhs, rhs = 0.0, 0.0
        for sd, g in zip(sds, grams):
            gram = g[name] if use_bias else g[name][:-1, :-1]
            if gram.shape[0] != (ref.shape[1] + 1 if use_bias else ref.shape[1]):
                raise ValueError(f"regmean: Gram of '{name}' has shape {tuple(gram.shape)} for weight {tuple(ref.shape)}")
            gram = alpha * gram + (1 - alpha) * torch.diag(torch.diagonal(gram))
            w = sd[wkey].double().to(gram.device)
            if use_bias:
                w = torch.cat([w, sd[bkey].double().to(gram.device)[:, None]], dim=1)  # (out, in+1)
            lhs = lhs + gram
            rhs = rhs + gram @ w.T  # (in[+1], out)
        # A rank-deficient Gram (fewer rows than inputs, alpha = 1) leaves W* underdetermined, and
        # solve() would return noise instead of failing, so check the conditioning explicitly.
        eig = torch.linalg.eigvalsh(lhs)
        if eig[0] <= 1e-12 * eig[-1].clamp_min(1e-300):
            raise ValueError(f"regmean: summed Gram of '{name}' is singular (eigenvalue ratio "
                             f"{float(eig[0] / eig[-1]):.1e}); use alpha < 1 or more data")
        sol = torch.linalg.solve(lhs, rhs).T  # (out, in[+1])
        solved[wkey] = sol[:, :ref.shape[1]].to(ref.device, ref.dtype).contiguous()
        if use_bias:
            solved[bkey] = sol[:, -1].to(ref.device, ref.dtype).contiguous()
    out = weighted_average(sds, keys=set(sds[0]) - set(solved))
    out.update(solved)
    return {k: out[k] for k in sds[0]}
