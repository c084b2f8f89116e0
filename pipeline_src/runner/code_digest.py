"""The digest of the package's code that names its job servers, read again only when a file changed.

A job server (`forkserver`, `gpu_server`) is keyed by the SHA-1 of the package's Python files, so a
job never runs an older version's code. Every job's launch asks for the key, in Snakemake's own
process. Hashing ~200 files there took 8.6 ms a job, 22 % of that process's CPU over the default
study (py-spy, 2026-11-29). Now the digest is kept with each file's stat (size, mtime, ctime,
inode) and the file list, and is reused while they are unchanged: a walk and ~200 `stat` calls,
1.0 ms.

An edit always changes the ctime, and the kernel cannot set it back. But file times are coarse (a
clock tick of a few ms), so an edit in the same tick as the hashing could leave every stat equal
("racy git"). A digest is kept only when every file is older than `SETTLED_S` at the hashing;
until then each call hashes again.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

SETTLED_S = 2.0  # files changed this recently are hashed again at each call
_MEMO: dict[Path, tuple[tuple, str]] = {}


def python_files(package: Path) -> list[tuple[tuple[str, ...], os.stat_result]]:
    """(relative path parts, stat) of every `*.py` file under `package`, sorted as `Path`s sort.

    The same files as `package.rglob("*.py")` (symlinked folders are not entered), but for
    `__pycache__` folders, which hold bytecode only: a third of the walk's time in this package."""
    found: list = []

    def walk(folder: str, rel: tuple[str, ...]) -> None:
        with os.scandir(folder) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        walk(e.path, (*rel, e.name))
                elif e.name.endswith(".py"):
                    found.append(((*rel, e.name), e.stat()))

    walk(str(package), ())
    return sorted(found, key=lambda f: f[0])


def code_digest(package: Path) -> str:
    """SHA-1 of the package's Python files (their relative names and bytes)."""
    files = python_files(package)
    stamp = tuple((parts, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) for parts, st in files)
    kept = _MEMO.get(package)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    started = time.time_ns()
    h = hashlib.sha1()
    for parts, _ in files:
        h.update("/".join(parts).encode() + b"\0" + package.joinpath(*parts).read_bytes() + b"\0")
    digest = h.hexdigest()
    newest = max((max(st.st_mtime_ns, st.st_ctime_ns) for _, st in files), default=0)
    if newest < started - int(SETTLED_S * 1e9):
        _MEMO[package] = (stamp, digest)
    else:
        _MEMO.pop(package, None)
    return digest
