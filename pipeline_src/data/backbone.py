"""The backbone: a timm VisionTransformer, from one of three sources.

- `pretrain` (embedded default): a small ViT trained here on the source task, so every
  fine-tuning method starts from (and TAFT linearizes around) a genuinely pretrained point;
- `timm`: `timm.create_model(timm_name, pretrained=...)` (weights download on the user's machine);
- `checkpoint`: a local safetensors or `.pth` file, loaded safely, into `timm_name` or `arch`.

Whatever the source, the backbone is stored as `model.safetensors` plus `backbone.json`, which
holds everything needed to rebuild it (`build_from_record`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import timm
import torch
from safetensors.torch import load_file, save_file
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.store.atomic import atomic_path, write_json

EMBEDDED_MEAN_STD = ([0.5], [0.5])


def embedded_vit_kwargs(cfg: dict, num_classes: int) -> dict[str, Any]:
    """VisionTransformer kwargs of the embedded backbone from `backbone.arch`."""
    arch = cfg["backbone"]["arch"]
    return dict(
        img_size=cfg["dataset"]["img_size"], in_chans=cfg["dataset"]["in_chans"], num_classes=num_classes,
        patch_size=arch["patch_size"], embed_dim=arch["embed_dim"], depth=arch["depth"],
        num_heads=arch["num_heads"], mlp_ratio=arch["mlp_ratio"], qkv_bias=arch["qkv_bias"],
        class_token=arch["class_token"], global_pool=arch["global_pool"], init_values=arch["init_values"],
    )


def build_from_record(record: dict) -> VisionTransformer:
    """Rebuild the (randomly initialised) architecture described by a backbone record."""
    if record.get("timm_name"):
        model = timm.create_model(record["timm_name"], pretrained=False, **record.get("create_kwargs", {}))
    else:
        model = VisionTransformer(**record["vit_kwargs"])
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"backbone {record.get('timm_name')}: expected a timm VisionTransformer, got {type(model).__name__}")
    return model


def load_state_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Load weights safely: safetensors, or a torch file with `weights_only=True`."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return load_file(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):  # common checkpoint wrappers
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"checkpoint {path}: expected a state dict of tensors")
    return state


def save_backbone(model: VisionTransformer, record: dict, out_dir: str | Path) -> None:
    """Write `model.safetensors` and `backbone.json` atomically."""
    out_dir = Path(out_dir)
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    write_json(record, out_dir / "backbone.json")


def load_backbone(out_dir: str | Path) -> tuple[VisionTransformer, dict]:
    """Load a stored backbone and its record."""
    out_dir = Path(out_dir)
    record = json.loads((out_dir / "backbone.json").read_text())
    model = build_from_record(record)
    model.load_state_dict(load_file(out_dir / "model.safetensors"))
    return model.eval(), record


def fit_position_embedding(state: dict[str, torch.Tensor], model: VisionTransformer) -> dict[str, torch.Tensor]:
    """A checkpoint's state with its absolute position embedding resampled to `model`'s patch grid
    (a checkpoint of another image size), as timm does for its pretrained weights; else unchanged.

    Args:
        state: the checkpoint's tensors.
        model: the ViT they load into (built at the study's image size).
    """
    pos = state.get("pos_embed")
    if pos is None or pos.shape == model.pos_embed.shape:
        return state
    prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    if pos.shape[-1] != model.pos_embed.shape[-1]:
        return state  # another width: load_state_dict names the mismatch
    resampled = resample_abs_pos_embed(pos, new_size=list(model.patch_embed.grid_size), num_prefix_tokens=prefix)
    return {**state, "pos_embed": resampled}


def external_backbone(cfg: dict) -> tuple[VisionTransformer, dict]:
    """A backbone from timm (optionally pretrained) or from a local checkpoint file."""
    bcfg = cfg["backbone"]
    if bcfg["timm_name"]:
        # Built at the study's image size and channels: timm resamples the pretrained position
        # embedding to the new grid and adapts the patch embedding's input channels.
        create_kwargs: dict[str, Any] = {"img_size": cfg["dataset"]["img_size"], "in_chans": cfg["dataset"]["in_chans"]}
        model = timm.create_model(bcfg["timm_name"], pretrained=bcfg["pretrained"] and bcfg["source"] == "timm",
                                  **create_kwargs)
        patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
        if patch and any(cfg["dataset"]["img_size"] % p for p in patch):
            raise ValueError(f"config key 'dataset.img_size': {cfg['dataset']['img_size']} is not a multiple of the "
                             f"patch size {tuple(patch)} of backbone.timm_name '{bcfg['timm_name']}'")
        record = {"timm_name": bcfg["timm_name"], "create_kwargs": create_kwargs}
    else:
        kwargs = embedded_vit_kwargs(cfg, num_classes=0)
        model = VisionTransformer(**kwargs)
        record = {"vit_kwargs": kwargs}
    if bcfg["source"] == "checkpoint":
        state = load_state_file(bcfg["checkpoint"])
        # The downstream head is always re-created, so a checkpoint's head is dropped.
        state = fit_position_embedding({k: v for k, v in state.items() if not k.startswith("head.")}, model)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("head.")]
        if missing or unexpected:
            raise ValueError(f"checkpoint {bcfg['checkpoint']}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    data_cfg = getattr(model, "pretrained_cfg", {}) or {}
    mean, std = data_cfg.get("mean"), data_cfg.get("std")
    if not mean or len(mean) != cfg["dataset"]["in_chans"]:
        mean, std = EMBEDDED_MEAN_STD[0] * cfg["dataset"]["in_chans"], EMBEDDED_MEAN_STD[1] * cfg["dataset"]["in_chans"]
    record.update(mean=list(mean), std=list(std), source=bcfg["source"])
    return model.eval(), record
