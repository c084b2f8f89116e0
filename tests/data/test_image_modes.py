"""Every PIL mode a dataset can hold is read as torchvision reads it (issue 33, item 3): more than
8 bits scaled, not clipped; alpha, palettes, CMYK and 1-bit as `pil_loader` converts them."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets.folder import pil_loader
from torchvision.io import ImageReadMode
from torchvision.io import decode_image as tv_decode
from torchvision.transforms.v2.functional import to_dtype

from pipeline_src.data.images import decode_image

SIZE = 8
ROW = np.array([0, 0, 15, 127, 239, 159, 0, 0])


def _grey16() -> np.ndarray:
    """A 16-bit ramp: the issue's row in the top byte, every low byte used too."""
    a = (ROW[None, :] * 257 + np.arange(SIZE)[:, None] * 13).astype(np.uint16)
    return np.clip(a, 0, 65535).astype(np.uint16)


@pytest.mark.parametrize("chans", [1, 3])
def test_a_16_bit_png_is_scaled_as_torchvision_decodes_it(tmp_path, chans):
    path = tmp_path / "g16.png"
    Image.fromarray(_grey16()).save(path)
    assert Image.open(path).mode == "I;16"
    ref = to_dtype(tv_decode(str(path), ImageReadMode.GRAY if chans == 1 else ImageReadMode.RGB), torch.uint8,
                   scale=True).numpy()
    got = decode_image(str(path), SIZE, chans, "s/0")
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got[0, 0], ROW)  # the row, not [.. 255 255 ..]


def test_mode_i_is_read_as_16_bit_samples(tmp_path):
    png, tif = tmp_path / "g16.png", tmp_path / "g32.tif"
    Image.fromarray(_grey16()).save(png)
    Image.fromarray(_grey16().astype(np.int32), "I").save(tif)
    assert Image.open(tif).mode == "I"
    ref = to_dtype(tv_decode(str(png), ImageReadMode.GRAY), torch.uint8, scale=True).numpy()
    np.testing.assert_array_equal(decode_image(str(tif), SIZE, 1, "s/0"), ref)


def test_mode_f_is_read_as_floats_in_0_1_like_to_dtype(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.uniform(-0.1, 1.1, (SIZE, SIZE)).astype(np.float32)
    path = tmp_path / "f.tif"
    Image.fromarray(a, "F").save(path)
    assert Image.open(path).mode == "F"
    ref = to_dtype(torch.from_numpy(a).clamp(0, 1)[None], torch.uint8, scale=True).numpy()
    np.testing.assert_array_equal(decode_image(str(path), SIZE, 1, "s/0"), ref)


def _mode_images() -> dict[str, Image.Image]:
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    grey = rng.integers(0, 256, (SIZE, SIZE), dtype=np.uint8)
    la = Image.merge("LA", [Image.fromarray(grey), Image.fromarray(grey[::-1].copy())])
    p = Image.fromarray(rgb).quantize(16)
    p.info["transparency"] = 3
    return {"LA.png": la, "P-transparent.png": p, "CMYK.jpg": Image.fromarray(rgb).convert("CMYK"),
            "1.png": Image.fromarray(grey > 127), "RGBA.png": Image.fromarray(rgb).convert("RGBA"),
            "L.png": Image.fromarray(grey)}


@pytest.mark.parametrize("name", list(_mode_images()))
@pytest.mark.parametrize("chans", [1, 3])
def test_8_bit_modes_match_torchvisions_pil_loader(tmp_path, name, chans):
    path = tmp_path / name
    _mode_images()[name].save(path, **({"transparency": 3} if name.startswith("P") else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL: palette images with transparency "should be converted to RGBA"
        ref = np.asarray(pil_loader(path))  # RGB, as torchvision's ImageFolder (and timm's) hands it over
        if chans == 1:
            ref = np.asarray(pil_loader(path).convert("L"))
        got = decode_image(str(path), SIZE, chans, "s/0")
    np.testing.assert_array_equal(got, ref.reshape(SIZE, SIZE, chans).transpose(2, 0, 1))
