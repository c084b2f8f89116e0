"""Files written through pipeline_src/store/atomic.py get the mode a plain open() would (issue 15, item 4),
and a later run removes the temporary files of killed writers, only theirs (issue 24, item 2)."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors.torch import save_file

from pipeline_src.store import atomic
from pipeline_src.store.atomic import atomic_path, write_json, write_parquet, write_text
from tests.conftest import REPO


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


def killed_writer(path: Path) -> None:
    """A real process SIGKILLed between its write and its rename (issue 24, item 2)."""
    code = ("import os, signal, sys\nfrom pipeline_src.store.atomic import atomic_path\n"
            "with atomic_path(sys.argv[1]) as tmp:\n    tmp.write_bytes(b'half')\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL


def test_a_later_run_removes_the_temp_files_of_killed_writers_only(tmp_path):
    root = tmp_path / "results"
    killed_writer(root / "compose" / "regmean.parquet")
    left = list(root.rglob("*.tmp"))
    assert len(left) == 1 and left[0].name.startswith(".regmean.parquet.~")  # what the kill leaves
    assert not (root / "compose" / "regmean.parquet").exists()
    legacy = root / ".old.parquet.ab12cd_9.tmp"  # the code before: no writer in the name
    foreign = root / f".x.parquet.~123-456@{'other-host.example'}~abcd1234.tmp"
    for f in (legacy, foreign):
        f.write_bytes(b"")
    recent_foreign = root / ".y.parquet.~123-456@other-host.example~abcd1234.tmp"
    recent_foreign.write_bytes(b"")
    day = atomic.UNCHECKABLE_STALE_S + 60
    for f in (legacy, foreign):
        os.utime(f, (time.time() - day, time.time() - day))
    not_ours = root / ".user.tmp"
    not_ours.write_bytes(b"")
    with atomic_path(root / "live.parquet") as live:  # a writer that still runs (this process)
        live.write_bytes(b"x")
        removed = atomic.remove_stale_temps(root)
        assert live.exists()
    assert sorted(removed) == sorted([left[0], legacy, foreign])
    assert sorted(root.rglob("*.tmp")) == sorted([recent_foreign, not_ours])
    assert (root / "live.parquet").read_bytes() == b"x"
    assert atomic.remove_stale_temps(tmp_path / "missing") == []


def test_a_reused_pid_does_not_keep_a_dead_writers_temp(tmp_path):
    me = os.getpid()
    wrong_start = atomic._start_time(me) + 1  # this pid, but a process started at another time
    tmp = tmp_path / f".m.safetensors.~{me}-{wrong_start}@{atomic._host()}~abcd1234.tmp"
    tmp.write_bytes(b"")
    assert atomic.remove_stale_temps(tmp_path) == [tmp]


def test_no_rename_once_the_run_owner_is_gone(tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a real process of this host that has ended
    monkeypatch.setenv(atomic.RUN_OWNER_ENV, f"{dead.pid}-1@{atomic._host()}")
    assert atomic.run_owner_gone()
    with pytest.raises(atomic.RunGone, match="was killed"):
        write_text("late", tmp_path / "x.txt")
    assert not (tmp_path / "x.txt").exists()
    monkeypatch.setenv(atomic.RUN_OWNER_ENV, f"{dead.pid}-1@another-host")  # a cluster job's Snakemake
    assert not atomic.run_owner_gone()
    monkeypatch.setenv(atomic.RUN_OWNER_ENV, atomic.run_owner_token())  # this process: alive
    assert not atomic.run_owner_gone()
    write_text("on time", tmp_path / "x.txt")
    assert (tmp_path / "x.txt").read_text() == "on time"
