"""Decoded images: every sample's image resized to uint8 (C, H, W), written in bounded chunks
into `images.npy` (N, C, H, W) that jobs read by row (`npy_rows.py`), and the model input made per batch.

The listing they follow (sample ids, classes, paths) is `pipeline_src/plan/samples.py`, which
the DAG needs at parse time without torch.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline_src.data.npy_rows import NpyWriter
from pipeline_src.plan.dataset_layouts import SampleList
from pipeline_src.plan.image_check import decode_errors

CHUNK = 256  # images decoded and written at a time: prepare's memory is bounded by this, not the dataset


def _digits(size: int, chans: int) -> np.ndarray:
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 16.0  # (N, 1, 8, 8), values 0..16
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.expand(-1, chans, -1, -1)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8).contiguous().numpy()


def decode_image(path: str, size: int, chans: int, sample_id: str) -> np.ndarray:
    """One image file as uint8 (C, size, size); an unreadable file is an error naming it."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("L" if chans == 1 else "RGB").resize((size, size), Image.BILINEAR))
    except decode_errors() as e:
        raise ValueError(f"sample {sample_id}: cannot read image {path}: {type(e).__name__}: {e} "
                         "(dataset.skip_corrupt: true skips such files)") from e
    return arr.reshape(size, size, chans).transpose(2, 0, 1)


def write_images(samples: SampleList, dataset_cfg: dict, path: str | Path, threads: int = 1) -> tuple[int, ...]:
    """Decode and resize every image into `path` (uint8 .npy, (N, C, img_size, img_size)), atomically.

    Args:
        samples: the listing (paths None for digits).
        dataset_cfg: the `dataset` config (img_size, in_chans).
        path: destination `.npy`.
        threads: decoding threads (PIL releases the GIL while decoding and resizing).

    Returns:
        the array's shape.
    """
    size, chans = dataset_cfg["img_size"], dataset_cfg["in_chans"]
    n = len(samples.sample_ids)
    writer = NpyWriter(path, (n, chans, size, size), np.uint8)
    try:
        if samples.paths is None:
            writer.write(0, _digits(size, chans))
        else:
            with ThreadPoolExecutor(max(1, threads)) as pool:
                for start in range(0, n, CHUNK):
                    end = min(n, start + CHUNK)
                    decoded = pool.map(decode_image, samples.paths[start:end], [size] * (end - start),
                                       [chans] * (end - start), samples.sample_ids[start:end])
                    writer.write(start, np.stack(list(decoded)))
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return (n, chans, size, size)


def load_images(samples: SampleList, dataset_cfg: dict) -> torch.Tensor:
    """Every image decoded in memory, uint8 (N, C, img_size, img_size): for small datasets and tests."""
    size, chans = dataset_cfg["img_size"], dataset_cfg["in_chans"]
    if samples.paths is None:
        return torch.from_numpy(_digits(size, chans))
    if not samples.paths:
        return torch.empty((0, chans, size, size), dtype=torch.uint8)
    return torch.from_numpy(np.stack([decode_image(p, size, chans, i)
                                      for p, i in zip(samples.paths, samples.sample_ids)]))


def to_model_input(images: torch.Tensor, mean: list[float], std: list[float], dtype=torch.float32) -> torch.Tensor:
    """uint8 images (N, C, H, W) → normalised float tensor for the backbone, on their device."""
    x = images.to(dtype) / 255.0
    mean_t = torch.tensor(mean, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    return (x - mean_t) / std_t
