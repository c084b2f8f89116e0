"""Shared references for the DP tests: per-example gradients by micro-batches of size one."""
from __future__ import annotations

import torch
from torch import nn

from pipeline_src.dp.norm_samplers import wrap_fast
from tests.conftest import tiny_vit


def ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


def call(model: nn.Module, x):
    return model(list(x)) if isinstance(x, (list, tuple)) else model(x)


def batch_size(x) -> int:
    return len(x[0]) if isinstance(x, (list, tuple)) else len(x)


def take(x, i: int):
    return [t[i:i + 1] for t in x] if isinstance(x, (list, tuple)) else x[i:i + 1]


def microbatch_grads(model: nn.Module, x, y: torch.Tensor, loss_fn=ce) -> dict[str, torch.Tensor]:
    """Per-example gradients {name: (B, *shape)} from B separate backward passes."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    per = {n: [] for n in names}
    for i in range(batch_size(x)):
        model.zero_grad()
        loss_fn(call(model, take(x, i)), y[i:i + 1]).sum().backward()
        for n, p in model.named_parameters():
            if p.requires_grad:
                per[n].append(p.grad.detach().clone())
    model.zero_grad()
    return {n: torch.stack(v) for n, v in per.items()}


def fast_sq_norms(model: nn.Module, x, y: torch.Tensor, loss_fn=ce) -> dict[str, torch.Tensor]:
    """Squared per-example norms {name: (B,)} from our samplers in Opacus' ghost hooks."""
    gsm = wrap_fast(model, max_grad_norm=1.0, loss_reduction="mean")
    try:
        loss_fn(call(gsm, x), y).mean().backward()
        return {n: p._norm_sample.detach() ** 2 for n, p in model.named_parameters() if p.requires_grad}
    finally:
        gsm.cleanup()
        model.zero_grad()


def assert_norms_match(model: nn.Module, x, y: torch.Tensor, loss_fn=ce, rtol: float = 1e-5,
                       zero_grad_suffixes: tuple[str, ...] = ()) -> None:
    """Fast squared norms equal micro-batch ones per parameter. Parameters ending in one of
    `zero_grad_suffixes` have an exactly zero gradient by symmetry (e.g. a key bias under
    softmax shift-invariance) and must come out ~0; every other one must be non-trivial."""
    ref = microbatch_grads(model, x, y, loss_fn)
    got = fast_sq_norms(model, x, y, loss_fn)
    assert set(got) == set(ref) and got
    scale = max(float(g.pow(2).flatten(1).sum(1).max()) for g in ref.values())
    for n, g in ref.items():
        want = g.reshape(g.shape[0], -1).pow(2).sum(1)
        if n.endswith(zero_grad_suffixes):
            assert float(got[n].max()) <= 1e-20 * scale, n
            continue
        assert want.abs().max() > 1e-12, f"{n}: near-zero reference gradient makes the test vacuous"
        torch.testing.assert_close(got[n], want, rtol=rtol, atol=1e-12 * float(want.max()), msg=n)


def test_microbatch_reference_sums_to_batch_gradient():
    """The reference itself: mean of per-example gradients equals the batch gradient."""
    model = tiny_vit(train=True)
    x = torch.randn(4, 1, 16, 16, dtype=torch.float64)
    y = torch.randint(0, 5, (4,))
    per = microbatch_grads(model, x, y)
    ce(model(x), y).mean().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(per[n].mean(0), p.grad, rtol=1e-9, atol=1e-12)


def fixed_coins(seed: int) -> dict:
    """Replayable noise and sampling generators (two streams), so tests can compare clipping modes
    on the same coins; a release never passes these (train_private then draws secret ones)."""
    return {"noise_generator": torch.Generator().manual_seed(seed),
            "sampler_generator": torch.Generator().manual_seed(seed + 1)}
