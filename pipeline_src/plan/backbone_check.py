"""Check an external backbone at validation, before any job, without importing torch.

A bad checkpoint or timm name found only inside the `pretrain` job makes Snakemake delete that
job's previous outputs, the good backbone every other result depends on. So validation reads what
it can cheaply: a safetensors file's header (8 bytes of little-endian header length, then JSON
naming every tensor's dtype, shape and byte range), or a torch zip file's central directory.
"""
from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

# Bytes per element of the safetensors dtypes.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
               "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


def safetensors_header(path: str | Path) -> dict[str, dict]:
    """The tensor entries of a safetensors file, after checking they fit the file exactly.

    Args:
        path: a `.safetensors` file.

    Raises:
        ValueError: the file is truncated, padded or not safetensors.
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, too short for a safetensors file")
        n = int.from_bytes(head, "little")
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"header length {n} does not fit the file's {size} bytes (truncated or not safetensors)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = 0
    for name, t in tensors.items():
        try:
            begin, stop = t["data_offsets"]
            nbytes = math.prod(t["shape"]) * DTYPE_BYTES[t["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor '{name}' has a malformed header entry {t!r}") from None
        if stop - begin != nbytes or begin < 0:
            raise ValueError(f"tensor '{name}' spans {stop - begin} bytes, its shape needs {nbytes}")
        end = max(end, stop)
    if end != size - 8 - n:
        raise ValueError(f"header describes {end} bytes of tensor data, the file holds {size - 8 - n} "
                         "(truncated or corrupt)")
    return tensors


def check_torch_file(path: str | Path) -> None:
    """Check a `.pth`/`.pt` file: a torch zip archive whose directory is intact and holds `data.pkl`.

    The legacy (pre-1.6) pickle format has no directory to check and is accepted as is.

    Raises:
        ValueError: the file is truncated or not a torch checkpoint.
    """
    path = Path(path)
    size = path.stat().st_size
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
        if not any(i.filename.endswith("data.pkl") for i in infos):
            raise ValueError("a zip file without data.pkl, not a torch checkpoint")
        for i in infos:
            if i.header_offset + i.compress_size > size:
                raise ValueError(f"member {i.filename} runs past the end of the file (truncated)")
        return
    with path.open("rb") as f:
        if f.read(1) != b"\x80":  # a pickle protocol opcode starts the legacy format
            raise ValueError("neither a torch zip checkpoint nor a legacy torch file (truncated or corrupt)")


def check_vit_keys(tensors: dict[str, dict], depth: int | None, embed_dim: int | None) -> None:
    """Check that safetensors entries hold a timm VisionTransformer's weights.

    Args:
        tensors: entries from `safetensors_header`.
        depth: the number of blocks expected (`backbone.arch.depth`), or None for a timm model.
        embed_dim: the expected width, or None.

    Raises:
        ValueError: naming the missing key or the mismatch.
    """
    if "patch_embed.proj.weight" not in tensors:
        some = sorted(tensors)[:5]
        raise ValueError(f"no 'patch_embed.proj.weight' among its {len(tensors)} tensors (first: {some}); "
                         "expected a timm VisionTransformer state dict")
    blocks = {int(k.split(".")[1]) for k in tensors if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    if not blocks:
        raise ValueError("no 'blocks.<i>.*' tensors; expected a timm VisionTransformer state dict")
    if depth is not None and blocks != set(range(depth)):
        raise ValueError(f"holds blocks {min(blocks)}..{max(blocks)} ({len(blocks)}), backbone.arch.depth is {depth}")
    width = tensors["patch_embed.proj.weight"]["shape"][0]
    if embed_dim is not None and width != embed_dim:
        raise ValueError(f"patch_embed.proj.weight has width {width}, backbone.arch.embed_dim is {embed_dim}")
