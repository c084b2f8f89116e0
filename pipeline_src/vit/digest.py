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


# Attributes that change how a forward runs, not what it computes (or only in train mode).
_NOT_FUNCTION = frozenset({"training", "fused_attn", "inplace", "grad_checkpointing"})


def _scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, tuple) and all(isinstance(e, (bool, int, float, str)) for e in v))


def module_config(model) -> list:
    """The architecture's configuration, as JSON-able data: per module (in order), its path, its
    class and its public scalar attributes (a LayerNorm's eps, an attention's scale and head count,
    a GELU's approximation, ...). Two models with equal weights compute the same function only if
    these match too, so the linearization id hashes them with the weights.

    Args:
        model: an nn.Module.
    """
    out = []
    for name, m in model.named_modules():
        attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(vars(m).items())
                 if not k.startswith("_") and k not in _NOT_FUNCTION and _scalar(v)}
        out.append([name, f"{type(m).__module__}.{type(m).__qualname__}", attrs])
    return out
