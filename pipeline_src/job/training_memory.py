"""Training memory as the LAST paper counts it (Tang et al., "Low-Rank Attention Side-Tuning",
2024, Table 7): weights, gradients, optimizer state and activations, net of everything else a
process holds (the interpreter, torch's libraries, the data).

A process's peak RSS is mostly torch itself on a small model (the Fashion study's LAST job peaked
at 96 % of full fine-tuning's RSS), so the claims table counts tensors instead:
- weights: every parameter and buffer of the model, frozen ones included, once per storage;
- gradients: the trainable parameters' bytes;
- optimizer state: AdamW keeps two tensors (m, v) of each trainable parameter;
- activations: the bytes autograd saves for backward during one training batch, once per storage,
  parameters (and views of them) left out. Measured on the job's first training batch through
  `torch.autograd.graph.saved_tensors_hooks`, which observe without changing a value.
The same count runs on any device; on a GPU the record's `peak_mem_mb` (CUDA max allocated) is
beside it.
"""
from __future__ import annotations

from torch import nn

from pipeline_src.job.counters import ACTIVATIONS, saved_activation_bytes  # noqa: F401  (re-exported)

ADAMW_STATES = 2  # exp_avg, exp_avg_sq per trainable parameter


def _bytes(tensors) -> int:
    seen, n = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            n += storage.nbytes()
    return n


def training_memory(model: nn.Module, optimizer_states: int = ADAMW_STATES) -> dict[str, float | int | None]:
    """The four parts of Table 7 in MB, their sum, and the batch the activations were measured on.

    Args:
        model: the model as trained (frozen parts included).
        optimizer_states: tensors the optimizer keeps per trainable parameter (AdamW: 2).
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    mb = 1 / 2 ** 20
    parts = {
        "weights_mb": _bytes([*model.parameters(), *model.buffers()]) * mb,
        "gradients_mb": _bytes(trainable) * mb,
        "optimizer_mb": optimizer_states * _bytes(trainable) * mb,
        "activations_mb": None if ACTIVATIONS["bytes"] is None else ACTIVATIONS["bytes"] * mb,
    }
    total = None if parts["activations_mb"] is None else sum(parts.values())
    return {**parts, "train_mem_mb": total, "activations_batch": ACTIVATIONS["batch"]}
