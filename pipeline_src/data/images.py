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
from pipeline_src.plan.samples import digits_csv

CHUNK = 256  # images decoded and written at a time: prepare's memory is bounded by this, not the dataset


def digits_images() -> np.ndarray:
    """scikit-learn's `load_digits().images`, float64 (N, 8, 8) values 0..16, read from the same CSV
    as it does (`plan/samples.digits_csv`) without importing scikit-learn."""
    import gzip

    with gzip.open(digits_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", ndmin=2)  # (N, 65): 64 pixels, then the label
    return table[:, :-1].reshape(-1, 8, 8)


def _digits(size: int, chans: int) -> np.ndarray:
    x = torch.tensor(digits_images(), dtype=torch.float32)[:, None] / 16.0  # (N, 1, 8, 8), values 0..16
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.expand(-1, chans, -1, -1)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8).contiguous().numpy()


def to_8bit(im):
    """An image of more than 8 bits per sample scaled to 8 (`L`), as torchvision reads it
    (`torchvision.io.decode_image`, then `v2.functional.to_dtype(..., torch.uint8, scale=True)`).
    PIL's own `convert("L")` clips them at 255 instead: a 16-bit PNG came out saturated.

    Args:
        im: a PIL image. `I;16*`: the top 8 of 16 bits; `I` (what older Pillows open a 16-bit PNG
            as) is read as 16-bit samples the same way; `F`: floats in [0, 1], times 255.999 and
            floored, as `to_dtype` does. Every other mode (`1`, `L`, `LA`, `P` with or without
            transparency, `RGB(A)`, `CMYK`, ...) is returned as it is: `convert("RGB")`/`("L")`
            then gives torchvision's `pil_loader` and timm's loader result (alpha dropped).
    """
    from PIL import Image

    if im.mode.startswith("I;16") or im.mode == "I":
        a = np.clip(np.asarray(im, dtype=np.int64), 0, 65535) >> 8
    elif im.mode == "F":
        a = np.clip(np.asarray(im, dtype=np.float64), 0.0, 1.0) * (255.0 + 1.0 - 1e-3)
    else:
        return im
    return Image.fromarray(a.astype(np.uint8), "L")


def decode_image(path: str, size: int, chans: int, sample_id: str) -> np.ndarray:
    """One image file as uint8 (C, size, size); an unreadable file is an error naming it."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            arr = np.asarray(to_8bit(im).convert("L" if chans == 1 else "RGB").resize((size, size), Image.BILINEAR))
    except decode_errors() as e:
        raise ValueError(f"sample {sample_id}: cannot read image {path}: {type(e).__name__}: {e} "
                         "(dataset.skip_corrupt: true skips such files)") from e
    return arr.reshape(size, size, chans).transpose(2, 0, 1)


def _resize(block: np.ndarray, size: int, chans: int) -> np.ndarray:
    """uint8 (B, H, W) grey images → uint8 (B, chans, size, size), resized as `decode_image` does (PIL bilinear)."""
    from PIL import Image

    if block.shape[1:] != (size, size):
        block = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR)) for im in block])
    return np.repeat(block[:, None], chans, axis=1)


def _idx_blocks(samples: SampleList, dataset_cfg: dict, size: int, chans: int):
    """The listed samples' images from the IDX files, in listing order, CHUNK rows of the file at a
    time (streamed from the gzip stream: never the whole file). `source_rows` number the train
    file's images first, then the test file's, ascending as `list_idx` lists them."""
    from pipeline_src.plan.idx_files import DEFAULT_PATH, IMAGES_MAGIC, PREFIXES, find_file, image_blocks, read_header

    wanted = np.asarray(samples.source_rows, dtype=np.int64)
    if len(wanted) > 1 and (np.diff(wanted) <= 0).any():
        raise ValueError("idx samples must be listed in file order")
    offset = 0
    for split in ("train", "test"):
        header = read_header(find_file(dataset_cfg.get("path") or DEFAULT_PATH, PREFIXES[split], "images-idx3"),
                             IMAGES_MAGIC)
        n = header.dims[0]
        mine = wanted[(wanted >= offset) & (wanted < offset + n)] - offset
        if len(mine):
            for start, block in image_blocks(header, CHUNK):
                pick = mine[(mine >= start) & (mine < start + len(block))] - start
                if len(pick):
                    yield _resize(block[pick], size, chans)
                if start + len(block) > mine[-1]:
                    break  # the rest of the file holds no listed image
        offset += n


def write_images(samples: SampleList, dataset_cfg: dict, path: str | Path, threads: int = 1) -> tuple[int, ...]:
    """Decode and resize every image into `path` (uint8 .npy, (N, C, img_size, img_size)), atomically.

    Args:
        samples: the listing (paths None for digits and idx, which read `source_rows` of their source).
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
        if dataset_cfg["source"] == "idx":
            for block in _idx_blocks(samples, dataset_cfg, size, chans):
                writer.write(writer.rows_written, block)
        elif samples.paths is None:
            rows = samples.source_rows if samples.source_rows is not None else slice(None)
            writer.write(0, _digits(size, chans)[rows])
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
    """Every image decoded in memory, uint8 (N, C, img_size, img_size), C-contiguous: for small
    datasets and tests."""
    size, chans = dataset_cfg["img_size"], dataset_cfg["in_chans"]
    if dataset_cfg["source"] == "idx":
        blocks = list(_idx_blocks(samples, dataset_cfg, size, chans))
        return torch.from_numpy(np.concatenate(blocks) if blocks else np.empty((0, chans, size, size), np.uint8))
    if samples.paths is None:
        rows = samples.source_rows if samples.source_rows is not None else slice(None)
        return torch.from_numpy(np.ascontiguousarray(_digits(size, chans)[rows]))
    if not samples.paths:
        return torch.empty((0, chans, size, size), dtype=torch.uint8)
    # contiguous (N, C, H, W), as `images.npy` stores them: a stack of transposed (H, W, C) decodes
    # is channels-last in memory, and oneDNN convolves that layout with other roundings
    return torch.from_numpy(np.ascontiguousarray(np.stack([decode_image(p, size, chans, i)
                                                           for p, i in zip(samples.paths, samples.sample_ids)])))


def to_model_input(images: torch.Tensor, mean: list[float], std: list[float], dtype=torch.float32,
                   size: int | None = None) -> torch.Tensor:
    """uint8 images (N, C, H, W) → normalised float tensor for the backbone, on their device.

    Args:
        images: uint8 (N, C, H, W), where the model runs (copy them there as uint8: a quarter of
            float32's bytes over the bus).
        mean, std: the backbone's normalisation, per channel.
        dtype: the float dtype computed in.
        size: the model's input side; images of another side are resized to it here, on their
            device, as `decode_image` resizes a file at `prepare` (bilinear, antialiased when
            shrinking, like PIL's), without its rounding to uint8 (tests/data/test_device_input.py
            compares the two). None: the images' own side.
    """
    x = images.to(dtype)
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        # (N, C, H, W) -> (N, C, size, size); antialias: PIL's filter support widens when shrinking
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    x = x / 255.0
    mean_t = torch.tensor(mean, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    return (x - mean_t) / std_t
