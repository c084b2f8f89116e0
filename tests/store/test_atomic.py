"""Files written through pipeline_src/store/atomic.py get the mode a plain open() would (issue 15, item 4)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors.torch import save_file

from pipeline_src.store.atomic import atomic_path, write_json, write_parquet, write_text


def _write_all(folder: Path) -> list[Path]:
    write_json({"a": 1}, folder / "x.json")
    write_text("hi\n", folder / "x.txt")
    write_parquet(pa.table({"a": [1, 2]}), folder / "sub" / "x.parquet")
    with atomic_path(folder / "x.safetensors") as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp))
    return [folder / "x.json", folder / "x.txt", folder / "sub" / "x.parquet", folder / "x.safetensors"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_written_files_respect_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        files = _write_all(tmp_path)
        (tmp_path / "plain").write_text("reference")  # what open() gives under this umask
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == mode
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == mode, f
    assert not list(tmp_path.rglob("*.tmp"))  # no temp file left behind


def test_a_failed_write_leaves_neither_file_nor_temp(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "x.bin") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_private_files_are_owner_only_under_umask_022(tmp_path):
    """The provenance store (key, members) and an explicit private mode ignore a permissive umask."""
    from pipeline_src.store.private_provenance import STORE, store_members

    old = os.umask(0o022)
    try:
        ref = store_members(tmp_path, ["café", "b"])
        write_parquet(pa.table({"x": [1]}), tmp_path / "split" / "shard0.parquet", mode=0o600)
        write_parquet(pa.table({"x": [1]}), tmp_path / "public.parquet")
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(tmp_path / STORE / "key") == 0o600
    assert mode(tmp_path / STORE / "members" / f"{ref}.parquet") == 0o600
    assert mode(tmp_path / STORE / "members") == 0o700
    assert mode(tmp_path / "split" / "shard0.parquet") == 0o600
    assert mode(tmp_path / "public.parquet") == 0o644
