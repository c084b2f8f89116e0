"""The fine-tuning methods of the DAG, by `kind` (the `methods.<name>.kind` config key).

Each method builds a *tuned model* from the backbone: an `nn.Module` with
`prefix(x)` (frozen, cacheable features), `forward_from_prefix(h)` (logits),
`trainable_state()` and `load_trainable_state(state)`. Training, composition and
evaluation only use that interface.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.finetune import TailFineTune
from pipeline_src.vit_parts import reset_head


class TunedModel(Protocol):
    def prefix(self, x: torch.Tensor) -> torch.Tensor: ...
    def forward_from_prefix(self, h: torch.Tensor) -> torch.Tensor: ...
    def trainable_state(self) -> dict[str, torch.Tensor]: ...
    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None: ...


@dataclass(frozen=True)
class Method:
    """A registered fine-tuning method.

    Args:
        kind: the config's `kind`.
        build: (backbone copy with downstream head, method config) → tuned model.
        loss: default training loss name.
        paper: the method's reference.
    """

    kind: str
    build: Callable[[VisionTransformer, dict], TunedModel]
    loss: str
    paper: str


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> None:
    """Add a method; a second method of the same kind is refused."""
    if method.kind in METHODS:
        raise ValueError(f"method kind '{method.kind}' is already registered")
    METHODS[method.kind] = method


def get_method(kind: str) -> Method:
    try:
        return METHODS[kind]
    except KeyError:
        raise ValueError(f"unknown method kind '{kind}'; known: {sorted(METHODS)}") from None


def build_tuned_model(backbone: VisionTransformer, method_cfg: dict, num_classes: int, seed: int) -> TunedModel:
    """A fresh tuned model: a copy of the backbone, a seeded downstream head, the method's wrapper."""
    model = copy.deepcopy(backbone)
    reset_head(model, num_classes, seed)
    return get_method(method_cfg["kind"]).build(model, method_cfg)


register_method(Method("fc", lambda m, c: TailFineTune(m, k=0), "cross_entropy",
                       "Linear probing (head only)."))
register_method(Method("nlft", lambda m, c: TailFineTune(m, k=c["k"]), "cross_entropy",
                       "Non-linear fine-tuning of the last k blocks (Liu & Soatto et al., ICLR 2024, Table 1)."))
register_method(Method("full", lambda m, c: TailFineTune(m, k=len(m.blocks), full=True), "cross_entropy",
                       "Full fine-tuning."))
