"""Atomic file writes: write to a temporary sibling, then rename.

An interrupted job therefore never leaves a half-written checkpoint or Parquet file. A job killed
between the write and the rename (SIGKILL, a lost node) does leave its temporary file, so each one
is named after its writer, `.<name>.~<pid>-<start time>@<host>~<random>.tmp`, and
`remove_stale_temps` (called when a run starts, `workflow/rules/common.smk`) removes those whose
writer is gone, and only those: a job of another run still writing in the same folder keeps its own.

A job whose Snakemake was killed must not write behind the rerun: the main Snakemake process puts
its own tag in `PIPELINE_RUN_OWNER` (`run_owner_token`), which its jobs inherit, and the rename
refuses once that process is gone (`runner/orphan_guard.py` also stops such a job within 0.2 s).
"""
from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # pyarrow only where a Parquet file is written: a job's client imports this module
    import pyarrow as pa


def process_umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask sets it, for every
    thread: a job launched from a thread of Snakemake's process must not flip it under the others)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain open() gives a new file (0666 & ~umask): what every written result gets,
    whatever its writer made (mkstemp and some writers make 0600, which os.replace keeps)."""
    return 0o666 & ~process_umask()


# The writer's tag in a temporary name; hostnames hold letters, digits, '-' and '.' only.
_TEMP = re.compile(r"^\..+\.~(?P<pid>\d+)-(?P<start>\d+)@(?P<host>[A-Za-z0-9.-]*)~[^/]*\.tmp$")
# A temporary file of the code before writers were named: ".<name>.<8 random chars>.tmp".
_LEGACY_TEMP = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")
# A file whose writer cannot be checked (another host, or unnamed) is stale once untouched this long;
# a live writer touches its file at least every few minutes (NpyWriter writes batch by batch).
UNCHECKABLE_STALE_S = 24 * 3600


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a process from /proc/<pid>/stat (fields 3
    and 22); None where unreadable (no such process, or no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # from field 3 on
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])


def _start_time(pid: int) -> int:
    """A process's start time (0 where unreadable): with the pid it names one process, even after
    the pid is reused."""
    stat = _proc_stat(pid)
    return stat[1] if stat else 0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())


def make_temp(path: str | os.PathLike) -> tuple[int, Path]:
    """Create the temporary file for `path` in its folder, named after this process.

    Args:
        path: the final destination (its folder must exist).
    Returns:
        (open file descriptor, temporary path).
    """
    path = Path(path)
    pid = os.getpid()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.~{pid}-{_start_time(pid)}@{_host()}~", suffix=".tmp",
                               dir=path.parent)
    return fd, Path(tmp)


def _alive(pid: int, start: int) -> bool:
    """Whether the process `pid` that started at `start` (0: unknown) still runs; a zombie does not."""
    stat = _proc_stat(pid)
    if stat is None:  # no /proc entry: gone, or a system without /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process holds that pid
            pass
        return not Path("/proc/self/stat").exists()
    state, started = stat
    return state != "Z" and (not start or started == start)


RUN_OWNER_ENV = "PIPELINE_RUN_OWNER"
_OWNER = re.compile(r"^(?P<pid>\d+)-(?P<start>\d+)@(?P<host>[A-Za-z0-9.-]*)$")


class RunGone(RuntimeError):
    """The Snakemake run that started this job was killed: its outputs must not appear."""


def run_owner_token() -> str:
    """This process as the owner of a run, `<pid>-<start time>@<host>`, for `RUN_OWNER_ENV`."""
    pid = os.getpid()
    return f"{pid}-{_start_time(pid)}@{_host()}"


def run_owner_is_me() -> bool:
    """True in the process that `RUN_OWNER_ENV` names (the main Snakemake process: a `run:` job's
    thread needs no guard against its own death)."""
    m = _OWNER.match(os.environ.get(RUN_OWNER_ENV, ""))
    return bool(m) and m["host"] == _host() and int(m["pid"]) == os.getpid()


def run_owner_gone() -> bool:
    """True when `RUN_OWNER_ENV` names a process of this host that no longer runs. False without
    it, or for another host's (a cluster job's Snakemake runs elsewhere: Slurm stops its jobs)."""
    m = _OWNER.match(os.environ.get(RUN_OWNER_ENV, ""))
    return bool(m) and m["host"] == _host() and not _alive(int(m["pid"]), int(m["start"]))


def commit(tmp: Path, path: Path, mode: int | None = None) -> None:
    """Rename a finished temporary file onto `path`, with the mode a plain open() gives (or `mode`),
    unless the job's run is gone (`RunGone`; the temp file stays, and the next run removes it).

    Args:
        tmp: the temporary file (`make_temp`).
        path: its destination.
        mode: the file's mode (e.g. 0o600 for a private file); None: 0666 & ~umask.
    """
    if run_owner_gone():
        raise RunGone(f"{path}: not written: the Snakemake run of this job was killed")
    os.chmod(tmp, file_mode() if mode is None else mode)  # readable to the user's group, as the umask says
    os.replace(tmp, path)


def remove_stale_temps(root: str | os.PathLike) -> list[Path]:
    """Remove the temporary files under `root` whose writer is gone: a process of this host that no
    longer runs (same pid and start time), or a file of another host's or of an unnamed writer left
    untouched for `UNCHECKABLE_STALE_S`.

    Args:
        root: a results folder (missing: nothing to do).
    Returns:
        The files removed.
    """
    removed, host, now = [], _host(), time.time()
    for tmp in Path(root).rglob(".*.tmp"):
        m = _TEMP.match(tmp.name)
        try:
            if m and m["host"] == host:
                stale = not _alive(int(m["pid"]), int(m["start"]))
            elif m or _LEGACY_TEMP.match(tmp.name):
                stale = now - tmp.stat().st_mtime > UNCHECKABLE_STALE_S
            else:
                continue  # not one of ours
            if stale and tmp.is_file():
                tmp.unlink()
                removed.append(tmp)
        except FileNotFoundError:  # its writer renamed it meanwhile
            continue
    return removed


@contextmanager
def atomic_path(path: str | os.PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` on success.

    Args:
        path: final destination. Parent folders are created.
        mode: the file's mode (e.g. 0o600 for a private file); None: 0666 & ~umask.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_path = make_temp(path)
    os.close(fd)
    try:
        yield tmp_path
        commit(tmp_path, path, mode)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_parquet(table: pa.Table, path: str | os.PathLike, mode: int | None = None) -> None:
    """Write a pyarrow table atomically (`mode`: as `atomic_path`)."""
    import pyarrow.parquet as pq

    with atomic_path(path, mode) as tmp:
        pq.write_table(table, tmp)


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write JSON atomically (sorted keys, so equal inputs give equal bytes)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write text atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
