"""Train-time augmentation (`data/augment.py`): timm's transform on stored images, seeded per
(seed, epoch, sample id), so runs replay and batches or workers do not change a sample's draw."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pipeline_src.data.augment import AugmentedInputs, augment_one, sample_seed, train_transform
from pipeline_src.data.images import to_model_input
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.methods.training import fit
from tests.steps.helpers import folder_config, run_prepare

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
AUG = {"enabled": True, "scale": [0.08, 1.0], "ratio": [0.75, 1.3333333333333333], "hflip": 0.5, "vflip": 0.0,
       "color_jitter": 0.4, "auto_augment": None, "interpolation": "bilinear", "re_prob": 0.25}


@pytest.fixture
def store(image_folder, tmp_path) -> SampleStore:
    return SampleStore(run_prepare(folder_config(image_folder), tmp_path))


def inputs(store, workers=0, seed=3, aug=AUG, prefix=lambda x: x) -> AugmentedInputs:
    ids = store.ids("target", "train")
    return AugmentedInputs(store, ids, train_transform(aug, 8, 3, MEAN, STD), prefix, torch.device("cpu"), seed,
                           workers)


def test_the_config_defaults_are_create_transform_arguments():
    from pipeline_src.plan.config import load_schema

    schema = load_schema()["properties"]["train"]["properties"]["augment"]["properties"]
    defaults = {k: v["default"] for k, v in schema.items()}
    assert defaults["enabled"] is False
    train_transform(defaults, 16, 1, [0.5], [0.5])  # every key is an argument timm accepts


def test_no_op_augmentation_is_the_stored_image(store):
    """With every random part switched off, the transform is the eval input (an independent path)."""
    off = {**AUG, "scale": [1.0, 1.0], "ratio": [1.0, 1.0], "hflip": 0.0, "color_jitter": 0.0, "re_prob": 0.0}
    x = inputs(store, aug=off)
    got = x[torch.arange(len(x))]
    expected = to_model_input(store.subset(x.ids).images, MEAN, STD)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_seeded_per_sample_and_epoch_and_global_rngs_untouched(store):
    t = train_transform(AUG, 8, 3, MEAN, STD)
    image = store.image_array.read([0])[0]
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    a, b, c = augment_one(t, image, 7), augment_one(t, image, 7), augment_one(t, image, 8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    assert sample_seed(0, 1, "a") == sample_seed(0, 1, "a")
    assert len({sample_seed(0, 1, "a"), sample_seed(0, 2, "a"), sample_seed(0, 1, "b"), sample_seed(1, 1, "a")}) == 4


def test_a_sample_gets_its_draw_whatever_its_batch_or_the_workers(store):
    x, y, z = inputs(store), inputs(store), inputs(store, workers=2)
    n = len(x)
    whole = x[torch.arange(n)]  # epoch 0, one batch
    parts = torch.cat([y[torch.tensor([k])] for k in range(n)])  # epoch 0, one sample per batch
    try:
        pooled = z[torch.arange(n)]
    finally:
        z.close()
    assert torch.equal(whole, parts) and torch.equal(whole, pooled)
    assert x.epoch == 1 and not torch.equal(x[torch.arange(n)], whole)  # a new epoch, new draws
    assert not torch.equal(inputs(store, seed=4)[torch.arange(n)], whole)


def test_fit_from_augmented_inputs_replays(store):
    def run() -> torch.Tensor:
        torch.manual_seed(0)
        head = torch.nn.Linear(3 * 8 * 8, 3)
        x = inputs(store, prefix=lambda im: im.flatten(1))
        labels = store.subset(x.ids).labels
        fit(head, list(head.parameters()), x, labels, epochs=2, batch_size=4, lr=1e-2, weight_decay=0.0, seed=1)
        assert x.epoch == 2
        return head.weight.detach().clone()

    assert torch.equal(run(), run())


@pytest.mark.parametrize("order_seed, hits", [(1, 6), (2, 0)])  # 2 epochs x 3 batches; a wrong guess: none
def test_prefetching_changes_the_speed_never_the_values(store, order_seed, hits):
    def run(**kw) -> tuple[torch.Tensor, AugmentedInputs]:
        torch.manual_seed(0)
        head = torch.nn.Linear(3 * 8 * 8, 3)
        ids = store.ids("target", "train")
        x = AugmentedInputs(store, ids, train_transform(AUG, 8, 3, MEAN, STD), lambda im: im.flatten(1),
                            torch.device("cpu"), 3, **kw)
        try:
            fit(head, list(head.parameters()), x, store.subset(ids).labels, epochs=2, batch_size=4, lr=1e-2,
                weight_decay=0.0, seed=1)
        finally:
            x.close()
        return head.weight.detach().clone(), x

    reference, _ = run()
    assert len(store.ids("target", "train")) in range(9, 13)  # 3 batches of 4 per epoch
    weights, x = run(workers=2, order_seed=order_seed, batch_size=4)
    assert torch.equal(weights, reference) and x.prefetched == hits


def test_close_stops_the_pool_whatever_sigterm_handler_the_process_inherited(image_folder, tmp_path):
    """`close()` returns while prefetched batches are still being augmented, whatever SIGTERM
    handler the process has (here a no-op; in the suite, a client's forwarding handler left
    behind). Two CI runs hung there: forked workers inherited the handler and outlived
    `Pool.terminate`, and a worker terminated mid-task died holding the result queue's lock.
    Run apart, with a time limit."""
    import subprocess
    import sys

    from tests.conftest import REPO

    samples = run_prepare(folder_config(image_folder), tmp_path)
    code = f"""
import signal, torch
from pipeline_src.data.augment import AugmentedInputs, train_transform
from pipeline_src.data.sample_store import SampleStore
signal.signal(signal.SIGTERM, lambda signum, frame: None)
store = SampleStore({str(samples)!r})
ids = store.ids("target", "train")
for _ in range(20):  # the old code hung within 10 rounds here, mostly in the first few
    x = AugmentedInputs(store, ids, train_transform({AUG!r}, 8, 3, {MEAN!r}, {STD!r}), lambda im: im,
                        torch.device("cpu"), 3, workers=2, order_seed=1, batch_size=4)
    x[torch.tensor([0])]  # off the predicted order: prefetched batches may still be pending
    x.close()
print("closed")
"""
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("AugmentedInputs.close() did not return within 60 s", pytrace=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "closed", proc.stderr[-3000:]
