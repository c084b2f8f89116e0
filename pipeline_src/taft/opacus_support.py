"""Opacus support for the Δ modules of tangent models.

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and
Removal", ICLR 2024 (private tangent fine-tuning). Every Δ of a TangentViT lives
in a standard module applied to the primal input (``nn.Linear``, ``nn.LayerNorm``,
``nn.Embedding``), for which Opacus has grad samplers. The one exception is
``DeltaScale`` (Δγ of a LayerScale), whose per-sample gradient is registered here.
"""
from __future__ import annotations

from pipeline_src.taft.jvp_layers import DeltaScale, delta_scale_grad_sample


def register_opacus_grad_samplers() -> None:
    """Register `delta_scale_grad_sample` for `DeltaScale` with Opacus (idempotent).

    Call before wrapping a TangentViT with LayerScale in an Opacus GradSampleModule
    (hooks, functorch or ghost clipping).
    """
    from opacus.grad_sample import register_grad_sampler
    from opacus.grad_sample.grad_sample_module import GradSampleModule

    if GradSampleModule.GRAD_SAMPLERS.get(DeltaScale) is not delta_scale_grad_sample:
        register_grad_sampler(DeltaScale)(delta_scale_grad_sample)
