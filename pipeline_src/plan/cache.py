"""A small on-disk cache for what validation derives from the data, so that building the DAG
(every `snakemake` call, dry runs included) does not reload a dataset or an accountant.

An entry is a JSON file named by the digest of its key, which holds everything the value
depends on (the config section, the seed, the versions of the packages that compute it). A
missing or unreadable entry is recomputed; a changed key is a new entry. Only values that
passed their checks are stored, so an error is always raised afresh.

Writes are held in memory after `hold_writes()` (the Snakefile calls it before validating) and
reach the disk only at `write_held()`, which the Snakefile's `onstart` calls: Snakemake runs it
for a run that starts jobs, never for a dry run (`-n`) or `--lint`, which leave `results/` as
they found it. The Snakefile is parsed before Snakemake knows which of them it is.
"""
from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from pipeline_src.store.atomic import write_json


def package_version(name: str) -> str:
    """A package's installed version without importing it (importing sklearn costs seconds)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


_held: dict[Path, Any] | None = None  # None: entries are written at once


def hold_writes() -> None:
    """Keep entries in memory from now on, until `write_held` (a run that starts jobs)."""
    global _held
    if _held is None:
        _held = {}


def write_held() -> int:
    """Write the held entries (atomically; a read-only folder keeps them unwritten); their count."""
    global _held
    held, _held = _held or {}, None
    for path, value in held.items():
        try:
            write_json(value, path)
        except OSError:  # a read-only results folder: work uncached
            pass
    return len(held)


def read_entry(path: str | Path) -> Any:
    """A stored (or held) entry. Raises OSError or ValueError when there is none or it is unreadable."""
    if _held is not None and Path(path) in _held:
        return _held[Path(path)]
    return json.loads(Path(path).read_text())


def write_entry(value: Any, path: str | Path) -> None:
    """Store an entry now, or hold it for `write_held` after `hold_writes`."""
    if _held is not None:
        _held[Path(path)] = value
        return
    try:
        write_json(value, path)
    except OSError:  # a read-only results folder: work uncached
        pass


def cached(cache_dir: str | Path | None, name: str, key: dict, compute: Callable[[], Any]) -> Any:
    """`compute()`, or its stored value for an identical key.

    Args:
        cache_dir: folder of the entries; None computes every time.
        name: what the value is (the entry's file name prefix).
        key: JSON-serialisable; everything the value depends on.
        compute: makes the value (JSON-serialisable); raises when the input is invalid.
    """
    if cache_dir is None:
        return compute()
    text = json.dumps(key, sort_keys=True)
    path = Path(cache_dir) / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    try:
        entry = read_entry(path)
        if entry["key"] == json.loads(text):
            return entry["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = compute()
    write_entry({"key": json.loads(text), "value": value}, path)
    return value
