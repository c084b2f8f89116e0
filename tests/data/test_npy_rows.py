"""Row reads and sequential writes of `.npy` files (`pipeline_src/data/npy_rows.py`)."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from pipeline_src.data import npy_rows
from pipeline_src.data.npy_rows import NpyRows, NpyWriter


def test_rows_in_any_order_equal_numpy_indexing(tmp_path, monkeypatch):
    a = np.random.default_rng(0).integers(0, 255, (50, 3, 4, 4), dtype=np.uint8)
    w = NpyWriter(tmp_path / "a.npy", a.shape, np.uint8)
    for s in range(0, 50, 16):
        w.write(s, a[s:s + 16])
    w.close()
    assert np.array_equal(np.load(tmp_path / "a.npy"), a)  # a plain .npy file
    rows = [7, 8, 9, 3, 3, 49, 0, 10, 48]
    r = NpyRows(tmp_path / "a.npy")
    assert r.shape == a.shape and np.array_equal(r.read(rows), a[rows])
    monkeypatch.setattr(npy_rows, "MAX_READ_BYTES", 1)  # one row per read
    assert np.array_equal(r.read(rows), a[rows]) and r.read([]).shape == (0, 3, 4, 4)
    with pytest.raises(IndexError, match="row 50 out of range"):
        r.read([1, 50])


def test_out_of_order_partial_or_truncated_files_are_errors(tmp_path):
    w = NpyWriter(tmp_path / "b.npy", (4, 2), np.float32)
    with pytest.raises(ValueError, match="in order"):
        w.write(2, np.zeros((2, 2), np.float32))
    w.write(0, np.zeros((2, 2), np.float32))
    with pytest.raises(RuntimeError, match="wrote 2 of 4 rows"):
        w.close()
    assert not list(tmp_path.iterdir())
    np.save(tmp_path / "c.npy", np.zeros((4, 2), np.float32))
    with open(tmp_path / "c.npy", "r+b") as f:
        f.truncate(f.seek(0, 2) - 4)
    with pytest.raises(ValueError, match="rerun the step"):
        NpyRows(tmp_path / "c.npy")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_written_arrays_follow_the_umask(tmp_path, umask, mode):
    """The image store and the feature caches get the mode a plain open() gives (issue 24, item 4)."""
    old = os.umask(umask)
    try:
        w = NpyWriter(tmp_path / "images.npy", (2, 3), np.uint8)
        w.write(0, np.zeros((2, 3), np.uint8))
        w.close()
        (tmp_path / "plain").write_text("reference")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "images.npy").stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images.npy", "plain"]  # no temp left
