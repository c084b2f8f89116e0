"""Everything a DP model releases is planned from the public size n̄, never the true size n:
under add/remove neighbours n alone tells D from D ± 1 (design notes §8, the release boundary)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline_src.dp import train_private
from pipeline_src.dp.full_batch import train_private_full_batch

PLANNED = ("sigma", "sample_rate", "steps", "public_size", "expected_batch_size", "epsilon_planned", "delta")


def zero_loss(out: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return 0.0 * out.sum(dim=1)  # per example, zero gradient: an update is the noise alone


def noise_only(n: int, public_size: int | None, *, full_batch: bool = False, epochs: int = 1):
    torch.manual_seed(n)
    model = nn.Linear(400, 100, bias=False).double()
    nn.init.zeros_(model.weight)
    x, y = torch.randn(n, 400, dtype=torch.float64), torch.zeros(n, dtype=torch.long)
    common = dict(loss_fn=zero_loss, epochs=epochs, lr=1.0, epsilon=8.0, delta=1e-5, max_grad_norm=2.0,
                  public_size=public_size)
    if full_batch:
        return train_private_full_batch(model, x, y, micro_batch_size=64, **common)
    return train_private(model, x, y, batch_size=50, **common)


@pytest.mark.parametrize("full_batch", [False, True])
def test_the_plan_and_the_record_do_not_depend_on_the_true_size(full_batch):
    records = [noise_only(n, 1000, full_batch=full_batch)[1] for n in (990, 991, 1010)]
    for key in PLANNED:
        assert len({r[key] for r in records}) == 1, key
    assert not {"n_samples", "num_samples"} & set(records[0])


def test_poisson_steps_are_normalised_by_the_public_expected_batch():
    """n = 1000 rows, n̄ = 2000, B = 50: q = 1/40, 40 steps, each N(0, (σC)²) / (q·n̄ = 50); with the
    true size the normaliser would be q·n = 25 and the update twice as large."""
    state, rec = noise_only(1000, 2000)
    assert rec["sample_rate"] == 1 / 40 and rec["steps_taken"] == 40 and rec["expected_batch_size"] == 50
    expected = rec["sigma"] * 2.0 / 50 * 40 ** 0.5
    assert state["weight"].std().item() == pytest.approx(expected, rel=0.03)


def test_full_batch_steps_divide_by_the_public_size():
    """The paper protocol: (Σ clip + noise) / n̄, not / n (n = 300, n̄ = 500)."""
    state, rec = noise_only(300, 500, full_batch=True)
    assert rec["sample_rate"] == 1.0 and rec["expected_batch_size"] == 500
    assert state["weight"].std().item() == pytest.approx(rec["sigma"] * 2.0 / 500, rel=0.03)
