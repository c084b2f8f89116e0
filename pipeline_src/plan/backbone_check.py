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


def safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The `__metadata__` strings of a safetensors header ({} when it has none).

    Args:
        path: a `.safetensors` file that `safetensors_header` accepted.
    """
    with Path(path).open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n)).get("__metadata__") or {}
    return meta if isinstance(meta, dict) else {}


def recorded_num_heads(path: str | Path) -> tuple[int, str] | None:
    """The head count a checkpoint records, and where: its safetensors metadata (`num_heads`) or the
    record the pipeline writes beside a backbone (`<stem>.json` or `backbone.json`, `vit_kwargs`).
    None: nowhere (shapes cannot show it: `qkv` is (3·D, D) for every split of D into heads)."""
    path = Path(path)
    meta = safetensors_metadata(path)
    if str(meta.get("num_heads", "")).isdigit():
        return int(meta["num_heads"]), "its metadata"
    for record in (path.with_suffix(".json"), path.parent / "backbone.json"):
        try:
            heads = json.loads(record.read_text())["vit_kwargs"]["num_heads"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(heads, int):
            return heads, str(record)
    return None


def check_vit_shapes(tensors: dict[str, dict], arch: dict, in_chans: int) -> None:
    """Check the tensor shapes of a ViT state dict against `backbone.arch`, from the header alone.

    A checkpoint of another `patch_size`, `mlp_ratio`, width, `qkv_bias`, class token or LayerScale
    passes a key check and fails only in the job, whose outputs Snakemake then deletes. The position
    embedding's token count is not checked: it is resampled to the study's grid.

    Args:
        tensors: entries from `safetensors_header` (after `check_vit_keys`).
        arch: `backbone.arch` (patch_size, embed_dim, mlp_ratio, qkv_bias, class_token, init_values).
        in_chans: `dataset.in_chans`.
    Raises:
        ValueError: naming the tensor, its shape, the expected shape and the arch key.
    """
    d, p = arch["embed_dim"], arch["patch_size"]
    hidden = int(d * arch["mlp_ratio"])  # timm's Mlp: hidden_features = int(dim * mlp_ratio)
    expect = {"patch_embed.proj.weight": ([d, in_chans, p, p], "patch_size, embed_dim and dataset.in_chans")}
    for i in sorted({int(k.split(".")[1]) for k in tensors if k.startswith("blocks.") and k.split(".")[1].isdigit()}):
        b = f"blocks.{i}."
        expect[b + "attn.qkv.weight"] = ([3 * d, d], "embed_dim")
        expect[b + "mlp.fc1.weight"] = ([hidden, d], f"mlp_ratio ({arch['mlp_ratio']} x embed_dim {d} = {hidden})")
        expect[b + "mlp.fc2.weight"] = ([d, hidden], f"mlp_ratio ({arch['mlp_ratio']} x embed_dim {d} = {hidden})")
        if arch["qkv_bias"] != (b + "attn.qkv.bias" in tensors):
            raise ValueError(f"{'has no' if arch['qkv_bias'] else 'has a'} '{b}attn.qkv.bias', backbone.arch.qkv_bias "
                             f"is {arch['qkv_bias']}")
        if (arch["init_values"] is not None) != (b + "ls1.gamma" in tensors):
            raise ValueError(f"{'has no' if arch['init_values'] is not None else 'has a'} LayerScale '{b}ls1.gamma', "
                             f"backbone.arch.init_values is {arch['init_values']}")
    if arch["class_token"] != ("cls_token" in tensors):
        raise ValueError(f"{'has no' if arch['class_token'] else 'has a'} 'cls_token', backbone.arch.class_token "
                         f"is {arch['class_token']}")
    for name, (shape, keys) in expect.items():
        got = tensors.get(name, {}).get("shape")
        if got is not None and list(got) != shape:
            raise ValueError(f"tensor '{name}' has shape {list(got)}, backbone.arch needs {shape} ({keys})")
