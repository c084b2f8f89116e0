"""`prepare` and `features` out of core: a shard's rows read back from the memory-mapped stores
are exactly what the old whole-dataset path (every image decoded and converted, every feature
computed in memory, then indexed) gave.

The job computes in batches of `BATCH` and the old path in one batch of 18: the same values up to
float32 rounding, not bit for bit (GEMM and convolution kernels block their sums by the batch's
shape, and that differs between CPUs). So features are compared at float32's tolerance
(`torch.testing.assert_close`'s defaults for float32: rtol 1.3e-6, atol 1e-5), and bit-equality is
asserted only between runs of the same kernels on the same operands; the module runs under
`tests/rounding_guard.py`, which makes any other bit-equality fail on every CPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.images import load_images, to_model_input
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.last.features import extract_features
from pipeline_src.plan.samples import list_samples
from pipeline_src.steps.features import load_rows
from pipeline_src.vit.parts import vit_prefix
from tests.steps.helpers import folder_config, run_features, run_prepare, write_backbone

pytestmark = pytest.mark.rounding_guard


@pytest.fixture
def prepared(tmp_path, image_folder):
    cfg = folder_config(image_folder, features={"dtype": "float32"})
    results = tmp_path / "results"
    run_prepare(cfg, results)
    write_backbone(results / "pretrain")
    return cfg, results


def old_features(cfg, results, fn_of):
    """The old path: every image in memory as float32, the backbone over all of them."""
    backbone, record = load_backbone(results / "pretrain")
    images = load_images(list_samples(cfg["dataset"]), cfg["dataset"])
    with torch.no_grad():
        return fn_of(backbone)(to_model_input(images, record["mean"], record["std"]))


def test_prepared_images_equal_the_in_memory_decode(prepared):
    cfg, results = prepared
    store = SampleStore(results / "prepare" / "samples.parquet")
    old = load_images(list_samples(cfg["dataset"]), cfg["dataset"])
    assert store.image_array.shape == (18, 3, 8, 8)
    assert np.array_equal(np.load(results / "prepare" / "images.npy", mmap_mode="r"), old.numpy())  # a plain .npy
    ids = store.ids("target", "train")[::-1]
    assert torch.equal(store.subset(ids).images, old[torch.from_numpy(store.rows(ids))])


def test_shard_rows_of_a_last_k_cache_equal_the_old_rows(prepared):
    cfg, results = prepared
    path = run_features(cfg, results, "last1")
    store = SampleStore(results / "prepare" / "samples.parquet")
    rows = list(store.rows(store.ids("target", "train"))[::2])
    old = old_features(cfg, results, lambda b: lambda x: vit_prefix(b, x, len(b.blocks) - 1))
    torch.testing.assert_close(load_rows(path, rows), old[torch.tensor(rows)])  # float32's tolerance (module doc)


def test_blocks_cache_keeps_only_what_last_reads_and_serves_the_model(prepared):
    from pipeline_src.methods.registry import build_tuned_model

    cfg, results = prepared
    path = run_features(cfg, results, "blocks", everys=[2])
    assert np.load(path, mmap_mode="r").shape[1] == 3  # z0, z2, z4 of depth 4: not all 5
    store = SampleStore(results / "prepare" / "samples.parquet")
    rows = list(store.rows(store.ids("target", "test")))
    old = old_features(cfg, results, lambda b: lambda x: torch.stack(extract_features(b, x, every=1), dim=1))
    backbone, _ = load_backbone(results / "pretrain")
    model = build_tuned_model(backbone, cfg["methods"]["last"], 3, 0).eval()
    h = load_rows(path, rows, model)
    assert model.cache_blocks == [0, 2, 4]
    torch.testing.assert_close(h, old[torch.tensor(rows)][:, [0, 2, 4]])
    x = to_model_input(store.subset(store.ids("target", "test")).images, [0.5] * 3, [0.25] * 3)
    with torch.no_grad():  # cached and computed prefixes give the same logits
        assert torch.allclose(model.forward_from_prefix(h), model(x), atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-3), ("bfloat16", 1.6e-2)])
def test_half_precision_caches_round_each_value_once(prepared, dtype, tol):
    cfg, results = prepared
    single = load_rows(run_features(cfg, results, "last1"), list(range(18)))  # the same job in float32
    cfg["features"]["dtype"] = dtype
    path = run_features(cfg, results, "last1")
    old = old_features(cfg, results, lambda b: lambda x: vit_prefix(b, x, len(b.blocks) - 1))
    got = load_rows(path, list(range(18)))
    cast = torch.float16 if dtype == "float16" else torch.bfloat16
    assert torch.equal(got, single.to(cast).float())  # one rounding of the job's own float32 values
    # relative rounding 2^-11 (fp16), 2^-8 (bf16), plus float32's atol for the other batch size
    assert ((got - old).abs() <= tol * old.abs() + 1e-5).all()


def test_blocks_cache_runs_the_backbone_once_per_batch(prepared, monkeypatch):
    from pipeline_src.last import features as last_features
    from pipeline_src.steps import features as step

    cfg, results = prepared
    calls = []
    real = last_features.extract_features
    monkeypatch.setattr(last_features, "extract_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(step, "BATCH", 5)  # 18 images: 4 batches
    path = run_features(cfg, results, "blocks", everys=[1])
    assert len(calls) == 4  # one backbone pass per batch, not one per kept block (5 here)
    old = old_features(cfg, results, lambda b: lambda x: torch.stack(extract_features(b, x, every=1), dim=1))
    torch.testing.assert_close(load_rows(path, list(range(18))), old)  # batches of 5 against one of 18


def test_the_blocks_cache_defaults_to_lasts_own_spacing(prepared):
    cfg, results = prepared
    path = run_features(cfg, results, "blocks", everys=None)  # no LAST setting read: LAST's default g = 2
    assert np.load(path, mmap_mode="r").shape[1] == 3
