"""Decoded images: every sample's image resized to uint8 (N, C, H, W), and the model input.

The listing they follow (sample ids, classes, paths) is `pipeline_src/plan/samples.py`, which
the DAG needs at parse time without torch.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pipeline_src.plan.samples import SampleList


def load_images(samples: SampleList, dataset_cfg: dict) -> torch.Tensor:
    """Decode and resize every image: uint8 tensor (N, C, img_size, img_size)."""
    size, chans = dataset_cfg["img_size"], dataset_cfg["in_chans"]
    if samples.paths is None:  # digits: values 0..16 on an 8x8 grid
        from sklearn.datasets import load_digits

        x = torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 16.0  # (N, 1, 8, 8)
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        x = x.expand(-1, chans, -1, -1)
        return (x.clamp(0, 1) * 255).round().to(torch.uint8).contiguous()
    from PIL import Image

    out = torch.empty((len(samples.paths), chans, size, size), dtype=torch.uint8)
    mode = "L" if chans == 1 else "RGB"
    for i, p in enumerate(samples.paths):
        try:
            with Image.open(p) as im:
                arr = np.asarray(im.convert(mode).resize((size, size), Image.BILINEAR))
        except OSError as e:
            raise ValueError(f"sample {samples.sample_ids[i]}: cannot read image {p}: {e}") from e
        out[i] = torch.from_numpy(arr.reshape(size, size, chans).copy()).permute(2, 0, 1)
    return out


def to_model_input(images: torch.Tensor, mean: list[float], std: list[float], dtype=torch.float32) -> torch.Tensor:
    """uint8 images (N, C, H, W) → normalised float tensor for the backbone."""
    x = images.to(dtype) / 255.0
    mean_t = torch.tensor(mean, dtype=dtype).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=dtype).view(1, -1, 1, 1)
    return (x - mean_t) / std_t
