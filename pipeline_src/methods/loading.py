"""Rebuild a trained or composed model of any method kind from its files."""
from __future__ import annotations

from pathlib import Path

from pipeline_src.data.backbone import load_backbone
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.store.model_io import load_model


def load_tuned_model(backbone_dir: str | Path, weights_path: str | Path, backbone=None):
    """Rebuild a trained or composed model from its weights, its record and the backbone.

    Args:
        backbone_dir: folder of the pretrained backbone.
        weights_path: the model's `.safetensors` (its record beside it).
        backbone: `load_backbone(backbone_dir)`, already loaded (several models of one job load it
            once); it is copied, not changed.
    """
    backbone, backbone_record = backbone or load_backbone(backbone_dir)
    state, record = load_model(weights_path)
    model = build_tuned_model(backbone, record["method_config"], record["num_classes"], record["head_seed"])
    model.load_trainable_state(state)
    return model, record, backbone_record
