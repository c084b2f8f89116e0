"""Trained and composed models on disk: `<name>.safetensors` (the tensors a method trains)
beside `<name>.json` (the record: config, seed, commit, sample ids, components)."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pipeline_src.plan.environment import fingerprint
from pipeline_src.store.atomic import atomic_path, write_json
from pipeline_src.store.provenance import git_commit


def save_model(state: dict[str, torch.Tensor], record: dict, weights_path: str | Path) -> None:
    """Write the weights and then the record (both atomically); the record gets the commit and time."""
    weights_path = Path(weights_path)
    with atomic_path(weights_path) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(tmp))
    record = {**record, "commit": git_commit(), "created_at": datetime.now(timezone.utc).isoformat(),
              "environment": fingerprint()}
    write_json(record, record_path(weights_path))


def record_path(weights_path: str | Path) -> Path:
    return Path(weights_path).with_suffix(".json")


def load_model(weights_path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Load weights (safetensors: no code execution) and their record."""
    weights_path = Path(weights_path)
    return load_file(weights_path), json.loads(record_path(weights_path).read_text())
