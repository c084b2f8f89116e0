"""The small-CNN reference (issue 42 §3): the learning rate chosen on val only, the seed moves the
init, its rows in the metrics schema, one job per seed."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from pipeline_src.methods.training import fit
from pipeline_src.plan.job_settings import init_seed
from pipeline_src.steps.baseline_small_cnn import SmallCNN, accuracy, build_cnn, train_and_select
from tests.conftest import REPO, planned_outputs, snakemake

TRAIN = {"epochs": 3, "batch_size": 8, "weight_decay": 0.0, "schedule": {"name": "constant"}}


def two_blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (n, 1, 6, 6) images of two classes told apart by a bright or a dark square."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 1, 6, 6, generator=gen, dtype=torch.float64)
    x[:, :, 1:4, 1:4] += (2.0 * y - 1.0).view(-1, 1, 1, 1).double() * 1.5
    return x, y


def test_the_rate_is_chosen_on_val_and_only_its_model_is_tested():
    """Val is the test images with the two labels swapped, so each rate's val accuracy is one minus
    its test accuracy: the val-chosen rate is the test-worst one, and the reported point must be it."""
    torch.set_num_threads(1)
    x, y = two_blobs(48, 0)
    xt, yt = two_blobs(40, 1)
    lrs = [0.05, 1e-5]  # one learns in three epochs, the other barely moves from its init
    data = {"train": (x, y), "val": (xt, 1 - yt)}
    lr, model, val_acc = train_and_select(data, lrs, TRAIN, init=3, order=4, num_classes=2, dtype=torch.float64)
    test_of = {}
    for rate in lrs:  # each rate trained again, independently, from the same init and batch order
        ref = build_cnn(3, 1, 2, 6, torch.float64)
        ref.train()
        fit(ref, list(ref.parameters()), x, y, epochs=3, batch_size=8, lr=rate, weight_decay=0.0, seed=4,
            schedule={"name": "constant"})
        test_of[rate] = accuracy(ref, xt, yt, 256)
    assert test_of[0.05] > test_of[1e-5] + 0.2  # the rates really disagree on test
    for rate in lrs:  # float64: the same arithmetic twice, equal well within any rounding
        assert val_acc[rate] == pytest.approx(1 - test_of[rate], abs=1e-12)
    assert lr == 1e-5 == max(lrs, key=lambda r: (val_acc[r], -lrs.index(r)))
    assert accuracy(model, xt, yt, 256) == pytest.approx(test_of[1e-5], abs=1e-12)  # the val choice, not the test best


def test_ties_go_to_the_first_rate_in_grid_order():
    x, y = two_blobs(16, 0)
    data = {"train": (x, y), "val": (x[:4], y[:4])}  # rates too small to change a prediction: a tie
    lr, _, val_acc = train_and_select(data, [1e-9, 2e-9], {**TRAIN, "epochs": 1}, init=0, order=0, num_classes=2,
                                      dtype=torch.float64)
    assert val_acc[1e-9] == val_acc[2e-9] and lr == 1e-9


def test_the_seed_changes_the_init_and_nothing_else_moves_it():
    a, b = build_cnn(init_seed(0, 0), 1, 5, 28), build_cnn(init_seed(0, 1), 1, 5, 28)
    again = build_cnn(init_seed(0, 0), 1, 5, 28)
    pa, pb, pg = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, again))
    assert not torch.equal(pa, pb) and torch.equal(pa, pg)
    state = torch.random.get_rng_state()
    build_cnn(1, 1, 5, 28)
    assert torch.equal(state, torch.random.get_rng_state())  # the init draws from its own seed only
    assert sum(p.numel() for p in a.parameters()) < 50_000  # small: a few tens of thousands


@pytest.mark.parametrize("img_size", [4, 5, 8, 28])
def test_any_image_size_runs_even_a_batch_of_one(img_size):
    model = SmallCNN(3, 4, img_size).train()
    assert model(torch.randn(1, 3, img_size, img_size)).shape == (1, 4)


def test_one_job_per_seed_writes_val_and_test_rows_in_the_metrics_schema(tmp_path):
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["baselines"] = {"small_cnn": True}
    cfg["seeds"] = [0, 1]
    cfg["train"] = {**cfg.get("train", {}), "epochs": 2}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    outs = [f"results/{cfg['experiment']}/metrics/baselines/small_cnn/s{s}.parquet" for s in (0, 1)]
    planned = [o for line in planned_outputs(snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "config.yaml")))
               for o in line.split(", ")]
    assert set(outs) <= set(planned)  # the study's default target (its report) plans one job per seed
    assert sum("/metrics/baselines/small_cnn/" in o for o in planned) == 2
    snakemake(tmp_path, *outs, "--cores", "1", "--configfile", str(tmp_path / "config.yaml"), timeout=600)
    tables = [pq.read_table(tmp_path / out).to_pandas() for out in outs]
    for seed, rows in enumerate(tables):
        rows = rows.set_index("split")
        assert set(rows.index) == {"val", "test"} and set(rows.method) == {"small-cnn"}
        assert set(rows.kind) == {"baseline"} and (rows.metric == "accuracy").all()
        assert (rows.shards == 1).all() and (rows.shard_id == 0).all() and (rows.seed == seed).all()
        variant = json.loads(rows.variant.iloc[0])
        assert variant["lr_grid"] == [0.001, 0.0001] and variant["lr"] in variant["lr_grid"]
        assert 0.2 < rows.value["test"] <= 1.0
        images = pq.read_table(tmp_path / outs[seed].replace("/metrics/", "/per_image/")).to_pandas()
        assert set(images.split) == {"test"} and images.sample_id.is_unique and (images.seed == seed).all()
        assert len(images) == rows.num_samples["test"] and images.correct.mean() == pytest.approx(rows.value["test"])


def test_channel_stats_read_in_chunks_equal_the_whole_splits(image_folder, tmp_path):
    from pipeline_src.data.sample_store import SampleStore
    from pipeline_src.steps.baseline_small_cnn import channel_stats
    from tests.steps.helpers import folder_config, run_prepare

    store = SampleStore(run_prepare(folder_config(image_folder), tmp_path))
    sub = store.split("target", "train")
    raw = sub.images.to(torch.float64) / 255.0
    mean, std = channel_stats(store, sub.rows, chunk=4)  # several chunks and a ragged last one
    assert len(sub.ids) > 4 and len(sub.ids) % 4
    torch.testing.assert_close(torch.tensor(mean, dtype=torch.float64), raw.mean(dim=(0, 2, 3)), rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.tensor(std, dtype=torch.float64), raw.std(dim=(0, 2, 3)), rtol=0, atol=1e-12)


def test_training_and_testing_read_a_batch_of_images_at_a_time(image_folder, tmp_path, monkeypatch):
    """The step's views (`StoredImages`) hold no split: every read is at most one batch, and the
    model trained from them is the one trained from the whole normalised tensors."""
    from pipeline_src.data.images import to_model_input
    from pipeline_src.data.sample_store import SampleStore, StoredImages
    from pipeline_src.steps.baseline_small_cnn import channel_stats, logits_of
    from tests.steps.helpers import folder_config, run_prepare

    store = SampleStore(run_prepare(folder_config(image_folder), tmp_path))
    splits = {s: store.split("target", s) for s in ("train", "val", "test")}
    mean, std = channel_stats(store, splits["train"].rows)
    reads: list[int] = []
    image_rows = SampleStore.image_rows
    monkeypatch.setattr(SampleStore, "image_rows", lambda self, rows: reads.append(len(rows)) or image_rows(self, rows))
    views = {s: (StoredImages(store, sub.ids, mean, std, "cpu"), sub.labels) for s, sub in splits.items()}
    train = {**TRAIN, "batch_size": 4}
    lr, model, val_acc = train_and_select(views, [1e-2, 1e-3], train, init=1, order=2, num_classes=3,
                                          eval_batch_size=2)
    streamed = logits_of(model, views["test"][0], 2)
    assert reads and max(reads) <= 4 < len(splits["train"].ids)
    whole = {s: (to_model_input(sub.images, mean, std), sub.labels) for s, sub in splits.items()}
    lr2, model2, val2 = train_and_select(whole, [1e-2, 1e-3], train, init=1, order=2, num_classes=3, eval_batch_size=2)
    assert (lr, val_acc) == (lr2, val2)
    torch.testing.assert_close(streamed, logits_of(model2, whole["test"][0], 2), rtol=1e-5, atol=1e-6)
