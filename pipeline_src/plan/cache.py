"""A small on-disk cache for what validation derives from the data, so that building the DAG
(every `snakemake` call, dry runs included) does not reload a dataset or an accountant.

An entry is a JSON file named by the digest of its key, which holds everything the value
depends on (the config section, the seed, the versions of the packages that compute it). A
missing or unreadable entry is recomputed; a changed key is a new entry. Only values that
passed their checks are stored, so an error is always raised afresh.
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
        entry = json.loads(path.read_text())
        if entry["key"] == json.loads(text):
            return entry["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = compute()
    try:
        write_json({"key": json.loads(text), "value": value}, path)
    except OSError:  # a read-only results folder: work uncached
        pass
    return value
