"""DP training reads a shard one Poisson batch at a time (issue 25): Opacus' Poisson loader samples
row positions with the secret sampler generator, and only those rows are read from the feature
cache (`CachedRows`). For the same generators the trained state equals, bit for bit, the old path
that sampled a whole-shard TensorDataset (the same positions, the same rows, the same clipped
sums and noise), in every clipping mode; full-batch DP-GD reads micro-batches the same way."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pipeline_src.data.feature_cache import CachedRows, FeatureCache, FeatureCacheWriter
from pipeline_src.dp import train_private
from pipeline_src.dp.budget import plan_budget
from pipeline_src.dp.full_batch import train_private_full_batch
from pipeline_src.dp.private_training import dp_backward, make_private_model
from tests.dp.test_reference import ce, fixed_coins

# compares results of different paths (batches, caches, threads): bit-equality only where the
# same kernels see the same operands, checked on any CPU (tests/rounding_guard.py)
pytestmark = pytest.mark.rounding_guard

ROWS = np.random.default_rng(0).permutation(60)[:45]  # a shard: 45 of 60 cache rows, unsorted
ARGS = dict(epochs=2, batch_size=9, lr=0.5, epsilon=4.0, delta=1e-3, max_grad_norm=0.5)


class CountingRows:
    """A `CachedRows` that records how many rows each read asks for."""

    def __init__(self, view: CachedRows) -> None:
        self.view, self.reads = view, []

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, idx):
        out = self.view[idx]
        self.reads.append(len(out))
        return out


def cache(tmp_path) -> FeatureCache:
    x = torch.randn(60, 6, generator=torch.Generator().manual_seed(1))
    w = FeatureCacheWriter(tmp_path / "f.npy", x.shape, "float16", {"cache": "test"})
    w.write(0, x)
    w.close()
    return FeatureCache(tmp_path / "f.npy")


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def labels() -> torch.Tensor:
    return torch.randint(0, 3, (len(ROWS),), generator=torch.Generator().manual_seed(2))


def old_train_private(m: nn.Module, x: torch.Tensor, y: torch.Tensor, mode: str, coins: dict) -> dict:
    """The loop before issue 25: Opacus' Poisson DPDataLoader over a TensorDataset of the shard."""
    budget = plan_budget(epsilon=ARGS["epsilon"], delta=ARGS["delta"], public_size=len(x), batch_size=ARGS["batch_size"],
                         epochs=ARGS["epochs"], max_grad_norm=ARGS["max_grad_norm"], accountant="rdp")
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=ARGS["lr"])
    loader = DataLoader(TensorDataset(x, y), batch_size=ARGS["batch_size"])
    _, module, dp_opt, dp_loader = make_private_model(m, opt, loader, mode=mode, sigma=budget["sigma"],
                                                      max_grad_norm=ARGS["max_grad_norm"], public_size=len(x), **coins)
    m.train()
    try:
        for _ in range(ARGS["epochs"]):
            for xb, yb in dp_loader:
                dp_opt.zero_grad()
                assert len(yb)  # this data never draws an empty batch: the old zero-grad branch is not needed
                dp_backward(module, dp_opt, ce(module(xb), yb), mode)
                dp_opt.step()
    finally:
        module.cleanup()
    return {n: p.detach().clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("mode", ["bk", "fast", "ghost", "hooks"])
def test_poisson_positions_read_from_the_cache_train_what_the_tensor_dataset_trained(tmp_path, mode):
    c = cache(tmp_path)
    view = CountingRows(CachedRows(c, ROWS))
    batches = []
    new, rec = train_private(model(), view, labels(), loss_fn=ce, mode=mode, progress=lambda s: batches.append(s["batch"]),
                             **ARGS, **fixed_coins(5))
    old = old_train_private(model(), c.rows(ROWS), labels(), mode, fixed_coins(5))
    assert new.keys() <= old.keys() and all(torch.equal(new[k], old[k]) for k in new)
    assert rec["steps_taken"] == len(batches) == 10 and view.reads == [b for b in batches if b]  # one read a step
    assert max(view.reads) < len(ROWS) // 2  # a Poisson batch (expected 9), never the shard


def test_full_batch_dp_reads_micro_batches_and_equals_the_eager_tensor(tmp_path):
    c = cache(tmp_path)
    view = CountingRows(CachedRows(c, ROWS))
    args = dict(loss_fn=ce, epochs=2, micro_batch_size=10, lr=0.5, epsilon=4.0, delta=1e-3, max_grad_norm=0.5)
    lazy, _ = train_private_full_batch(model(), view, labels(), **args, noise_generator=torch.Generator().manual_seed(3))
    eager, _ = train_private_full_batch(model(), c.rows(ROWS), labels(), **args,
                                        noise_generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(lazy[k], eager[k]) for k in lazy)
    assert view.reads == [10, 10, 10, 10, 5] * 2
