"""Whether a result file reads back whole: Parquet, JSON, safetensors and .npy (docs/reliability.md).

Every output is written atomically, so a file that exists was whole when written; this is for the
files that broke afterwards (a disk error, a copy cut short, a hand edit). Torch-free: the query CLI
and the output check (`store/check_outputs.py`) use it.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

CHECKED = (".parquet", ".json", ".safetensors", ".npy")  # the kinds of file `unreadable` can check


def _safetensors(path: Path) -> None:
    """The header parses and its tensors end where the file does (a cut file ends short)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if path.stat().st_size != 8 + n + end:
        raise ValueError(f"{path.stat().st_size} bytes where the header says {8 + n + end}")


def unreadable(path: str | Path) -> str | None:
    """Why a result file does not read back whole (None: it does, or it is of a kind not checked).

    Args:
        path: a `.parquet` (read whole: a footer alone misses broken pages), `.json`, `.safetensors`
            (its header against its size) or `.npy` (its header against its size) file.
    """
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            pq.read_table(path)
        elif path.suffix == ".json":
            json.loads(path.read_bytes())
        elif path.suffix == ".safetensors":
            _safetensors(path)
        elif path.suffix == ".npy":
            np.load(path, mmap_mode="r")
    except (OSError, ValueError, KeyError, TypeError, struct.error, EOFError) as e:  # each reader's own errors
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"
    return None
