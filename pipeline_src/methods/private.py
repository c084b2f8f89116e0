"""DP training of the DAG's tuned models (`pipeline_src.methods.registry`): each kind's trainable
scope for the regimes, its per-example loss, and a module view that runs from cached features.

DP-TAFT follows Liu & Soatto et al. 2024 ("Tangent Transformers for Composition, Privacy and
Removal", §3.4): the regimes select among the Δ parameters (full: every Δ; bitfit: Δ biases;
layernorm: Δ of the norms; fc: Δ of the head), optionally predicting from J·Δw only.
DP-NLFT trains inside the last k blocks, final norm and head; DP-LAST inside the side network
(Tang et al. 2024, "Low-Rank Attention Side-Tuning for Parameter-Efficient Fine-Tuning").
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from pipeline_src.dp.private_training import per_example_cross_entropy
from pipeline_src.dp.regimes import apply_regime, nlft_scope

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def regime_scope(model: nn.Module, kind: str) -> tuple[list[nn.Module], nn.Module]:
    """(trainable scope, head) of a tuned model, for `regimes.apply_regime`.

    Args:
        model: the tuned model built by `methods.build_tuned_model`.
        kind: its method kind: nlft (last k blocks, norms, head of the timm ViT), taft (every
            Δ module: CLS delta, tangent blocks, norms, head; the head's Δ is `head.delta`)
            or last (the side network; its head is `side.head`).
    Raises:
        ValueError: a kind DP training does not support.
    """
    if kind == "nlft":
        vit = model.model
        return nlft_scope(vit, len(vit.blocks) - model.start), vit.head
    if kind == "taft":
        parts = [model.cls_delta, *model.blocks, model.norm, model.fc_norm, model.head,
                 getattr(model, "head_dist", None)]  # DeiT distilled: the dist token's head
        return [m for m in parts if m is not None], model.head.delta
    if kind == "last":
        return [model.side], model.side.head
    raise ValueError(f"DP training: unsupported method kind '{kind}' (supported: nlft, taft, last)")


def per_example_loss(method_cfg: dict) -> LossFn:
    """The method's training loss per example, (logits, labels) -> (B,): taft's own loss
    (RSL by default, with its α and κ), cross-entropy otherwise. taft's `l2` and `radius` do
    not apply under DP (a data-independent penalty would be allowed, but is not part of the study).

    Args:
        method_cfg: the method config (after `plan.privacy.dp_method_config`).
    """
    if method_cfg["kind"] != "taft":
        return per_example_cross_entropy
    from pipeline_src.methods.registry import taft_options
    from pipeline_src.taft.losses import get_loss

    o = taft_options(method_cfg)
    fn = get_loss(o["loss"], o["alpha"], o["kappa"])
    return lambda logits, labels: fn(logits, labels, reduction="none")


def select_trainable(model: nn.Module, kind: str, regime: str, train_head: bool) -> list[str]:
    """Freeze the tuned model but for the regime's parameters; return their names.

    Args:
        model: the tuned model.
        kind: its method kind.
        regime: full | bitfit | layernorm | fc (see `regimes.apply_regime`).
        train_head: also train the head in the bitfit and layernorm regimes. The downstream
            head is new and random, so without it those regimes cannot classify; BitFit
            (Ben Zaken et al. 2022) trains the task's classifier with the biases too.
    """
    scope, head = regime_scope(model, kind)
    apply_regime(model, regime, scope, head)
    if train_head and regime in ("bitfit", "layernorm"):
        head.requires_grad_(True)
    return [n for n, p in model.named_parameters() if p.requires_grad]
