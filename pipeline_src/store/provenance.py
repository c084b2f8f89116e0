"""Provenance: the git commit and a stable digest of tensors, recorded with every model."""
from __future__ import annotations

import hashlib

from pipeline_src.plan.environment import PACKAGE_ROOT, git_commit  # noqa: F401 (re-exported: recorded with models)


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
