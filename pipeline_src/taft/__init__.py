"""Tangent Transformers (TAFT) for timm ViTs: closed-form JVP layers, the tangent model,
losses, composition/removal and training.

Paper: Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and Removal", ICLR 2024.
"""
from pipeline_src.taft.compose import check_same_linearization, compose_deltas, remaining_weights, subtract_component
from pipeline_src.taft.losses import delta_l2_penalty, get_loss, project_to_ball, rescaled_square_loss
from pipeline_src.taft.tangent_vit import TangentViT, check_supported
from pipeline_src.taft.train import train_tangent, train_tangent_vectorized

__all__ = [
    "TangentViT", "check_supported",
    "rescaled_square_loss", "get_loss", "delta_l2_penalty", "project_to_ball",
    "compose_deltas", "check_same_linearization", "subtract_component", "remaining_weights",
    "train_tangent", "train_tangent_vectorized",
]
