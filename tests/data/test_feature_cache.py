"""Out-of-core feature caches: rows read from the memory-mapped file equal the in-memory rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_src.data import feature_cache
from pipeline_src.data.feature_cache import FeatureCache, FeatureCacheWriter

# compares results of different paths (batches, caches, threads): bit-equality only where the
# same kernels see the same operands, checked on any CPU (tests/rounding_guard.py)
pytestmark = pytest.mark.rounding_guard


def write(path, x: torch.Tensor, dtype: str, chunk: int = 7, **meta) -> FeatureCache:
    w = FeatureCacheWriter(path, x.shape, dtype, {"cache": "test", **meta})
    for s in range(0, len(x), chunk):
        w.write(s, x[s:s + chunk])
    w.close()
    return FeatureCache(path)


ROWS = [17, 3, 3, 0, 29, 11]  # unsorted, with a repeat


@pytest.mark.parametrize("dtype,cast", [("float32", torch.float32), ("float16", torch.float16),
                                        ("bfloat16", torch.bfloat16)])
def test_rows_equal_the_in_memory_rows(tmp_path, dtype, cast):
    x = torch.randn(30, 5, 4) * 3
    cache = write(tmp_path / "f.npy", x, dtype)
    got = cache.rows(ROWS)
    assert got.dtype == torch.float32
    assert torch.equal(got, x.to(cast).float()[torch.tensor(ROWS)])
    assert torch.equal(cache[torch.tensor(ROWS)], got)  # tensor indexing, as the old whole-tensor path
    assert cache.meta["shape"] == [30, 5, 4] and cache.meta["dtype"] == dtype


def test_reads_in_chunks_give_the_same_rows(tmp_path, monkeypatch):
    x = torch.randn(30, 5, 4)
    cache = write(tmp_path / "f.npy", x, "float32")
    monkeypatch.setattr(feature_cache, "READ_CHUNK_BYTES", 1)  # one row per read
    assert torch.equal(cache.rows(ROWS), x[torch.tensor(ROWS)])


def test_blocks_selection_and_errors(tmp_path):
    x = torch.randn(10, 3, 2, 4)  # stored blocks 0, 2, 4
    cache = write(tmp_path / "f.npy", x, "float32", blocks=[0, 2, 4])
    assert torch.equal(cache.rows([4, 1], blocks=[4, 0]), x[[4, 1]][:, [2, 0]])
    with pytest.raises(KeyError, match=r"keeps blocks \[0, 2, 4\], not \[1\].*rerun the `features` rule"):
        cache.rows([0], blocks=[0, 1])
    with pytest.raises(IndexError, match="row 10 out of range"):
        cache.rows([0, 10])


def test_an_unfinished_or_unreadable_cache_is_an_error(tmp_path):
    w = FeatureCacheWriter(tmp_path / "f.npy", (4, 2), "float16", {})
    w.write(0, torch.zeros(2, 2))
    with pytest.raises(RuntimeError, match="wrote 2 of 4 rows"):
        w.close()
    assert not list(tmp_path.iterdir())  # neither the array nor a temporary file is left
    np.save(tmp_path / "g.npy", np.zeros((2, 2), np.float16))
    with pytest.raises(FileNotFoundError, match="g.json"):
        FeatureCache(tmp_path / "g.npy")
    with pytest.raises(ValueError, match="features.dtype"):
        FeatureCacheWriter(tmp_path / "h.npy", (1,), "float8", {})


@pytest.mark.parametrize("dtype,cast", [("float32", torch.float32), ("float16", torch.float16),
                                        ("bfloat16", torch.bfloat16)])
def test_stored_rows_convert_to_the_same_float32_rows(tmp_path, dtype, cast):
    """The GPU path of `CachedRows` copies `stored_rows` and converts on the device: the same
    float32 values as the CPU path's `rows`, bit for bit, with and without a block selection."""
    x = torch.randn(12, 3, 2, 4) * 3
    cache = write(tmp_path / "f.npy", x, dtype, blocks=[0, 2, 4])
    got = cache.stored_rows(np.array(ROWS[:4]) % 12, blocks=[4, 0])
    assert got.dtype == cast
    assert torch.equal(got.float(), cache.rows(np.array(ROWS[:4]) % 12, blocks=[4, 0]))


def test_to_storage_casts_before_the_copy():
    """bfloat16 autocast outputs go to a float16 cache without a float32 detour: the same bits."""
    h = torch.randn(4, 3, 8).to(torch.bfloat16)
    assert np.array_equal(feature_cache.to_storage(h, "float16"), feature_cache.to_storage(h.float(), "float16"))
    assert np.array_equal(feature_cache.to_storage(h, "bfloat16"),
                          h.view(torch.int16).numpy().view(np.uint16))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_resident_view_gives_the_per_batch_reads_bit_for_bit(tmp_path, dtype, monkeypatch):
    """`CachedRows(resident=True)` (the GPU default where the rows fit) reads its rows once and
    gathers each batch from them: the same float32 batches as reading each batch's rows."""
    from pipeline_src.data.feature_cache import CachedRows

    monkeypatch.setattr(feature_cache, "READ_CHUNK_BYTES", 3 * 2 * 2 * 4 * 4)  # several chunks of rows
    x = torch.randn(12, 3, 2, 4) * 3
    cache = write(tmp_path / "f.npy", x, dtype, blocks=[0, 2, 4])
    rows = np.array([5, 0, 11, 3, 3, 7, 1])
    per_batch, resident = (CachedRows(cache, rows, "cpu", blocks=[4, 0], resident=r) for r in (False, True))
    assert not CachedRows(cache, rows, "cpu").resident  # the CPU default: one batch held, not the shard
    for idx in (torch.tensor([6, 0, 2, 2]), np.array([1, 4]), slice(2, None), torch.tensor([], dtype=torch.int64)):
        got, want = resident[idx], per_batch[idx]
        assert got.dtype == torch.float32 and torch.equal(got, want), idx
    assert resident._held is not None and resident._held.dtype == feature_cache.TORCH_STORAGE[dtype]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_view_is_resident_and_equals_the_cpu_rows(tmp_path):
    from pipeline_src.data.feature_cache import CachedRows

    x = torch.randn(64, 5, 8) * 3
    cache = write(tmp_path / "f.npy", x, "bfloat16")
    view = CachedRows(cache, np.arange(64)[::-1].copy(), "cuda")
    assert view.resident
    idx = torch.randperm(64, device="cuda")[:16]
    assert torch.equal(view[idx].cpu(), CachedRows(cache, np.arange(64)[::-1].copy(), "cpu")[idx.cpu()])
