"""One entry point over the fusion methods: `fuse(method, sds, model=..., data=...)`.

The three methods (soup, Fisher, RegMean) are registered explicitly below, in this module,
so no registration depends on an import side effect; registering a name twice raises.
Methods that need statistics compute them per model on that model's own data by loading
each state dict into a copy of `model` (after matching, pass the matched state dicts).
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from pipeline_src.fusion.fisher import diagonal_fisher, fisher_merge
from pipeline_src.fusion.regmean import linear_input_grams, regmean_merge
from pipeline_src.fusion.soup import weighted_average

Data = tuple[torch.Tensor, "torch.Tensor | None"]
FusionFn = Callable[..., dict]
FUSION_METHODS: dict[str, FusionFn] = {}


def register(name: str) -> Callable[[FusionFn], FusionFn]:
    """Decorator adding a fusion method under `name`; refuses duplicates."""
    def deco(fn: FusionFn) -> FusionFn:
        if name in FUSION_METHODS:
            raise ValueError(f"fusion registry: method '{name}' is already registered")
        FUSION_METHODS[name] = fn
        return fn
    return deco


def _per_model(sds: list[dict], model: nn.Module | None, data: list[Data] | None, method: str,
               stat: Callable[[nn.Module, Data], dict]) -> list[dict]:
    if model is None or data is None:
        raise ValueError(f"fusion '{method}': needs `model` (a template) and `data` (one (inputs, labels) per model)")
    if len(data) != len(sds):
        raise ValueError(f"fusion '{method}': {len(data)} data sets for {len(sds)} models")
    work = copy.deepcopy(model)
    stats = []
    for sd, d in zip(sds, data):
        work.load_state_dict(sd)
        stats.append(stat(work, d))
    return stats


@register("soup")
def _soup(sds: list[dict], *, model=None, data=None, batch_size: int = 64, weights: list[float] | None = None) -> dict:
    return weighted_average(sds, weights)


@register("fisher")
def _fisher(sds: list[dict], *, model: nn.Module | None = None, data: list[Data] | None = None,
            batch_size: int = 64, eps: float = 1e-8, use_labels: bool = True) -> dict:
    fishers = _per_model(sds, model, data, "fisher",
                         lambda m, d: diagonal_fisher(m, d[0], d[1] if use_labels else None, batch_size))
    return fisher_merge(sds, fishers, eps)


@register("regmean")
def _regmean(sds: list[dict], *, model: nn.Module | None = None, data: list[Data] | None = None,
             batch_size: int = 64, alpha: float = 0.9, merge_bias: bool = False) -> dict:
    grams = _per_model(sds, model, data, "regmean", lambda m, d: linear_input_grams(m, d[0], batch_size))
    return regmean_merge(sds, grams, alpha, merge_bias)


def fuse(method: str, sds: list[dict], *, model: nn.Module | None = None, data: list[Data] | None = None,
         batch_size: int = 64, **options) -> dict:
    """Merge state dicts with a registered method.

    Args:
        method: 'soup', 'fisher' or 'regmean'.
        sds: state dicts of one architecture (match them first for different inits).
        model: template module for the statistics ('fisher', 'regmean').
        data: per model, (inputs, labels or None) from that model's own training data.
        batch_size: examples per statistics batch.
        **options: method options (soup: weights; fisher: eps, use_labels; regmean: alpha, merge_bias).
    """
    if method not in FUSION_METHODS:
        raise ValueError(f"fusion: unknown method '{method}'; choose from {sorted(FUSION_METHODS)}")
    return FUSION_METHODS[method](sds, model=model, data=data, batch_size=batch_size, **options)
