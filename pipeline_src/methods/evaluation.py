"""Top-1 accuracy and cross-entropy of logits against labels."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    logits, labels = logits.double(), labels.to(logits.device)
    return {
        "accuracy": (logits.argmax(-1) == labels).double().mean().item(),
        "loss": F.cross_entropy(logits, labels).item(),
    }
