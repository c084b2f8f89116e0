"""A stable digest of a model's tensors: which backbone (or linearization point) a model was made from."""
from __future__ import annotations

import hashlib


def state_digest(state: dict) -> str:
    """SHA-256 over names, shapes, dtypes and bytes of a state dict, in name order.

    Two models share a linearization point exactly when their base digests match.

    Args:
        state: name -> tensor (a `state_dict()`, or tensors read from safetensors).
    """
    import torch  # lazily: importing this module costs nothing until a digest is taken

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # raw bytes, any dtype
    return h.hexdigest()
