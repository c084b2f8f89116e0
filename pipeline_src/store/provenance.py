"""Provenance: the git commit and a stable digest of tensors, recorded with every model."""
from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the checkout this package runs from ('unknown' outside git),
    with '-dirty' when tracked files have uncommitted changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PACKAGE_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PACKAGE_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def state_digest(state: dict) -> str:
    """SHA-256 over names, shapes, dtypes and bytes of a state dict, in name order.

    Two models share a linearization point exactly when their base digests match.
    """
    import torch  # lazily: the Snakefile imports this module at parse time

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # raw bytes, any dtype
    return h.hexdigest()
