"""The stacked AdamW step against torch.optim.AdamW run on each member alone (float64)."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.optim.stacked_adamw import ADAM_BETAS, ADAM_EPS, stacked_adamw_


@pytest.mark.parametrize("per_member_step", [False, True])
def test_matches_torch_adamw_per_member(per_member_step: bool):
    torch.manual_seed(0)
    M, shape, steps = 3, (4, 5), 6
    lrs, wds = [1e-2, 3e-3, 5e-2], [0.0, 0.1, 0.01]
    start = torch.randn(M, *shape, dtype=torch.float64)
    grads = torch.randn(steps, M, *shape, dtype=torch.float64)
    # which members step at each step (all of them unless per-member step counts are tested)
    active = torch.ones(steps, M, dtype=torch.bool)
    if per_member_step:
        active[1, 0] = active[3, 2] = active[4, 2] = False

    refs = [torch.nn.Parameter(start[j].clone()) for j in range(M)]
    opts = [torch.optim.AdamW([p], lr=lrs[j], weight_decay=wds[j], betas=ADAM_BETAS, eps=ADAM_EPS, foreach=False)
            for j, p in enumerate(refs)]
    for k in range(steps):
        for j in range(M):
            if active[k, j]:
                refs[j].grad = grads[k, j].clone()
                opts[j].step()

    p, m, v = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    count = torch.zeros(M, dtype=torch.long)
    for k in range(steps):
        count += active[k]
        step = count if per_member_step else k + 1
        stacked_adamw_(p, grads[k], m, v, step, torch.tensor(lrs, dtype=torch.float64), torch.tensor(wds, dtype=torch.float64),
                       active=active[k] if per_member_step else None)
    for j in range(M):
        torch.testing.assert_close(p[j], refs[j].detach(), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(m[j], opts[j].state[refs[j]]["exp_avg"], rtol=1e-12, atol=1e-14)


def test_inactive_member_is_untouched():
    p, g = torch.ones(2, 3, dtype=torch.float64), torch.full((2, 3), 0.5, dtype=torch.float64)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    stacked_adamw_(p, g, m, v, torch.tensor([1, 0]), 0.1, active=torch.tensor([True, False]))
    assert torch.equal(p[1], torch.ones(3, dtype=torch.float64)) and torch.equal(m[1], torch.zeros(3, dtype=torch.float64))
    assert not torch.equal(p[0], torch.ones(3, dtype=torch.float64))
