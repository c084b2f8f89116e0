"""Shared fixtures: tiny timm ViTs in float64 and small on-disk datasets."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

REPO = Path(__file__).resolve().parent.parent


def tiny_vit(**overrides) -> VisionTransformer:
    kwargs = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)
    kwargs.update(overrides)
    torch.manual_seed(0)
    return VisionTransformer(**kwargs).double().eval()


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """An ImageFolder tree: 3 classes x 6 PNG images of 12x12 pixels."""
    from PIL import Image

    root = tmp_path / "shapes"
    rng = np.random.default_rng(0)
    for c in ("circle", "square", "triangle"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8)).save(root / c / f"img{i}.png")
    return root


@pytest.fixture(scope="module")
def float64_default():
    """Run a test module with float64 as torch's default dtype (also for its module-scoped
    fixtures), restoring the old default after."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
