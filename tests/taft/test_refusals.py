"""TAFT refuses what it cannot linearize by the module's path, not only its class."""
from __future__ import annotations

import pytest
from timm.layers import RmsNorm
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pipeline_src.taft import TangentViT

TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=3, embed_dim=16, depth=4, num_heads=2)


@pytest.mark.parametrize("norm_layer, what", [(RmsNorm, "RmsNorm"),
                                              (lambda d: nn.LayerNorm(d, elementwise_affine=False),
                                               "LayerNorm without affine weight and bias")])
def test_a_block_norm_taft_cannot_linearize_is_named_by_path(norm_layer, what):
    base = VisionTransformer(**TINY).eval()
    base.blocks[3].norm1 = norm_layer(16)
    with pytest.raises(ValueError, match=rf"TAFT does not support 'blocks\.3\.norm1' \({what}\)"):
        TangentViT(base, 1)
    TangentViT(VisionTransformer(**TINY).eval(), 1)  # the control: a plain ViT builds
    base = VisionTransformer(**TINY).eval()
    base.norm = norm_layer(16)
    with pytest.raises(ValueError, match=rf"TAFT does not support 'norm' \({what}\)"):
        TangentViT(base, 1)


def test_deit_distilled_in_distillation_training_mode_is_refused_by_name():
    base = VisionTransformerDistilled(**TINY).eval()
    TangentViT(base, 1)  # inference mode: the mean of both heads, as timm's eval forward
    base.set_distilled_training(True)
    with pytest.raises(ValueError, match=r"distillation-training mode \(distilled_training=True\)"):
        TangentViT(base, 1)
