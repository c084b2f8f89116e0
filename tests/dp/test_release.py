"""DP against a reader of the released files: the noise and the Poisson sampling come from two
secret generators that nothing recorded replays, the noise has the accounted scale, and
book-keeping refuses a parameter whose gradient it cannot see."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline_src.dp import train_private
from pipeline_src.dp.book_keeping import BookKeepingModule
from pipeline_src.dp.private_training import make_private_model
from tests.dp.test_reference import ce


def _data(n: int = 40, d: int = 6, k: int = 3):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, d, dtype=torch.float64, generator=g), torch.randint(0, k, (n,), generator=g)


def _train(seed_model: int = 0, **kw):
    torch.manual_seed(seed_model)
    model = nn.Linear(6, 3).double()
    x, y = _data()
    args = dict(loss_fn=ce, epochs=1, batch_size=10, lr=0.5, epsilon=8.0, delta=1e-3, max_grad_norm=1.0, mode="bk")
    return train_private(model, x, y, **{**args, **kw})


def test_replaying_a_release_from_its_recorded_inputs_gives_other_weights():
    (a, rec), (b, _) = _train(), _train()  # identical data, config, init and every recorded seed
    assert "seed" not in rec and rec["noise"].startswith("secret")
    assert max((a[n] - b[n]).abs().max().item() for n in a) > 1e-3


def test_training_draws_nothing_from_the_global_generator():
    """Today's fault was seeding the global generator (Opacus' sampler) and the noise alike."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    model = nn.Linear(6, 3).double()  # init draws happen before the snapshot below
    state = torch.get_rng_state()
    x, y = _data()
    train_private(model, x, y, loss_fn=ce, epochs=2, batch_size=10, lr=0.5, epsilon=8.0, delta=1e-3,
                  max_grad_norm=1.0)
    assert torch.equal(torch.get_rng_state(), state) and not torch.equal(before, state)


@pytest.mark.parametrize("mode", ["bk", "ghost", "hooks"])
def test_sampler_and_noise_use_two_distinct_non_global_generators(mode):
    model = nn.Linear(6, 3).double()
    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _, module, dp_opt, dp_loader = make_private_model(model, opt, loader, mode=mode, sigma=1.0, max_grad_norm=1.0)
    sampler_gen = dp_loader.batch_sampler.generator
    assert isinstance(sampler_gen, torch.Generator) and isinstance(dp_opt.generator, torch.Generator)
    assert sampler_gen is not dp_opt.generator and torch.default_generator not in (sampler_gen, dp_opt.generator)
    assert not torch.equal(sampler_gen.get_state(), dp_opt.generator.get_state())
    module.cleanup() if hasattr(module, "cleanup") else module._close()
    shared = torch.Generator()
    with pytest.raises(ValueError, match="must not share a generator"):
        make_private_model(nn.Linear(6, 3).double(), torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1), loader,
                           mode="bk", sigma=1.0, max_grad_norm=1.0, noise_generator=shared, sampler_generator=shared)


def test_noise_std_per_coordinate_is_sigma_c_over_expected_batch():
    """One SGD step with lr 1 on a loss with zero gradient: the update is the noise alone,
    N(0, (σC)²) per coordinate divided by the expected batch size B = qn (Opacus' mean reduction)."""
    d_in, d_out, n, batch, c = 500, 200, 1000, 50, 2.0
    model = nn.Linear(d_in, d_out, bias=False).double()
    nn.init.zeros_(model.weight)
    x, y = torch.randn(n, d_in, dtype=torch.float64), torch.zeros(n, dtype=torch.long)
    zero_loss = lambda out, _y: 0.0 * out.sum(dim=1)  # noqa: E731  per-example, zero gradient
    state, rec = train_private(model, x, y, loss_fn=zero_loss, epochs=1, batch_size=batch, lr=1.0, epsilon=8.0,
                               delta=1e-5, max_grad_norm=c)
    assert rec["steps_taken"] == n // batch
    # steps updates, each N(0, (σC/B)²): their sum has std √steps·σC/B per coordinate (1e5 coordinates)
    expected = rec["sigma"] * c / batch * rec["steps_taken"] ** 0.5
    measured = state["weight"].std().item()
    assert measured == pytest.approx(expected, rel=0.02)


def test_bk_refuses_a_parameter_used_outside_its_module():
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4).double()
            self.out = nn.Linear(4, 2).double()

        def forward(self, x):  # uses inner.weight directly, not through inner's forward
            return self.out(torch.tanh(x @ self.inner.weight.T))

    bk = BookKeepingModule(Parent(), max_grad_norm=1.0)
    with pytest.raises(NotImplementedError, match=r"'inner.weight' is used outside its module's forward"):
        bk(torch.randn(3, 4, dtype=torch.float64))
    ok = BookKeepingModule(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)).double(), max_grad_norm=1.0)
    for _ in range(2):  # the check runs on the first forward; later forwards are unguarded and equal
        out = ok(torch.randn(3, 4, dtype=torch.float64))
        ok.clipped_backward(ce(out, torch.zeros(3, dtype=torch.long)))
