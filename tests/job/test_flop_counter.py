"""The jobs' FLOP counter (`job/counters.flop_counter`) against torch's `FlopCounterMode` with the
same formulas, on the model paths the jobs count: a timm ViT's train step (attention through the
CPU's fused SDPA), TAFT's tangent step through the primal network, the vectorized shards'
`vmap(grad(...))` and a book-keeping DP step. Both count the same ops with the same formulas, so the
totals are equal integers; the lean counter only skips the per-module attribution."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from pipeline_src.dp.book_keeping import BookKeepingModule
from pipeline_src.job.counters import flop_counter
from pipeline_src.taft import TangentViT
from pipeline_src.taft.losses import get_loss
from pipeline_src.taft.train import stacked_gradients, tangent_step
from tests.conftest import tiny_vit

torch.set_num_threads(1)


def reference_counter() -> FlopCounterMode:
    """torch's counter with the CPU attention formulas the jobs' counter adds (already raw)."""
    extra = {op: f for op, f in flop_counter().flop_registry.items()
             if op not in torch.utils.flop_counter.flop_registry}
    for f in extra.values():
        f._get_raw = True
    return FlopCounterMode(display=False, custom_mapping=extra)


def images(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, 16, dtype=torch.float64, generator=g), torch.randint(0, 5, (n,), generator=g)


def vit_step():
    model = tiny_vit(train=True)
    x, y = images(6)
    return lambda: F.cross_entropy(model(x), y).backward()


def tangent():
    model = TangentViT(tiny_vit(), 1, delta_init_std=0.05)
    opt = torch.optim.SGD(model.delta_parameters(), lr=0.1)
    x, y = images(6)
    h = model.prefix(x).detach()
    return lambda: tangent_step(model, opt, h, y, get_loss("rsl"), weight_decay_l2=1e-3)


def vectorized():
    model = TangentViT(tiny_vit(), 1, delta_init_std=0.05)
    x, _ = images(8)
    params = {f"tuned.{n}": torch.stack([p.detach(), p.detach() + 0.01]) for n, p in model.named_delta_parameters()}
    h = model.prefix(x).detach().reshape(2, 4, *model.prefix(x).shape[1:])  # (S, b, N, D)
    y = torch.tensor([[0, 1, 2, 3], [4, 0, 1, 0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    fn = stacked_gradients(model, get_loss("rsl"), 1e-3)
    return lambda: fn(params, h, y, mask)


def book_keeping():
    model = TangentViT(tiny_vit(train=True), 1, delta_init_std=0.05)
    x, y = images(6)
    bk = BookKeepingModule(model, max_grad_norm=1.0)
    return lambda: bk.clipped_backward(F.cross_entropy(bk(x), y, reduction="none"))


@pytest.mark.parametrize("case", [vit_step, tangent, vectorized, book_keeping])
def test_totals_equal_torchs_flop_counter(case) -> None:
    step = case()
    step()  # the first call of each (the DP probe's first step, lazy setup) is not the one compared
    with reference_counter() as ref:
        step()
    with flop_counter() as got:
        step()
    assert ref.get_total_flops() > 0
    assert got.get_total_flops() == ref.get_total_flops()
    assert got.flops_by_math == {"float64": got.get_total_flops()}
    assert got.flops_by_op == {str(op): n for op, n in ref.get_flop_counts()["Global"].items()}


def test_counts_the_cpu_attention_kernel_and_leaves_other_ops_alone() -> None:
    q = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    with flop_counter() as c:
        out = F.scaled_dot_product_attention(q, q, q)
        q.exp().sum()  # no formula: not counted
    assert c.get_total_flops() == 2 * (2 * 2 * 3 * 5 * 5 * 4)
    assert torch.equal(out, F.scaled_dot_product_attention(q, q, q))


def test_a_new_pass_starts_from_zero() -> None:
    lin = torch.nn.Linear(3, 2).double()
    counter = flop_counter()
    for _ in range(2):
        with counter:
            lin(torch.randn(4, 3, dtype=torch.float64))
        assert counter.get_total_flops() == 2 * 4 * 3 * 2
