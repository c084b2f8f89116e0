"""A DP study's Snakemake metadata is owner-only from its first byte (docs/privacy.md): Snakemake's
own writer, patched by `plan/private_workspace.owner_only_metadata`, on a real FilePersistence."""
from __future__ import annotations

import os
import stat

import pytest
from snakemake.persistence.file import FilePersistence

from pipeline_src.plan.private_workspace import owner_only_metadata


@pytest.fixture
def umask_077():
    old = os.umask(0o077)  # what a DP study's parse sets (owner_only_umask)
    yield
    os.umask(old)


def _writer() -> FilePersistence:
    """A FilePersistence without a DAG: `_io_write` needs only its record-path helpers."""
    persistence = object.__new__(FilePersistence)
    persistence._max_len = None
    return persistence


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_snakemakes_metadata_writer_opens_its_records_to_the_group_unpatched(tmp_path, umask_077, monkeypatch):
    """The reason for the patch: even under the 077 umask Snakemake chmods a new record 0660."""
    monkeypatch.setattr(FilePersistence, "_io_write", getattr(FilePersistence._io_write, "__wrapped__",
                                                              FilePersistence._io_write))
    _writer()._io_write(str(tmp_path), {"params": ["member-1"]}, "results/x/split/shard0.parquet")
    (record,) = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert _mode(record) == 0o660


def test_patched_writer_keeps_new_and_rewritten_records_owner_only(tmp_path, umask_077, monkeypatch):
    monkeypatch.setattr(FilePersistence, "_io_write", FilePersistence._io_write)  # restored after the test
    owner_only_metadata()
    assert not owner_only_metadata()  # once only
    writer = _writer()
    key = "results/x/split/" + "a" * 600 + "/shard0.parquet"  # longer than a file name: nested folders
    writer._io_write(str(tmp_path), {"params": ["member-1"]}, key)
    writer._io_write(str(tmp_path), {"params": ["member-2"]}, key)  # an existing record, rewritten
    paths = list(tmp_path.rglob("*"))
    assert any(p.is_dir() for p in paths) and any(p.is_file() for p in paths)
    assert {str(p): _mode(p) for p in paths if _mode(p) & 0o077} == {}
