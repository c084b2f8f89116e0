"""features: cache the frozen prefix's output (the input of the last k blocks) once per
backbone and k, for every sample, so shard jobs never rerun the frozen blocks."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from pipeline_src.atomic import atomic_path
from pipeline_src.backbone import load_backbone
from pipeline_src.datasets import to_model_input
from pipeline_src.runtime import resolve_device, set_up_job
from pipeline_src.sample_store import SampleStore
from pipeline_src.step_args import StepArgs
from pipeline_src.training import batched_apply
from pipeline_src.vit_parts import vit_prefix


def main(args: StepArgs) -> None:
    cfg = args.config
    set_up_job(args.threads, cfg["seed"])
    device = resolve_device(cfg["device"])
    backbone, record = load_backbone(Path(args.input.backbone).parent)
    start = len(backbone.blocks) - int(args.wildcards["k"])  # features entering the last k blocks
    backbone.to(device)
    store = SampleStore(args.input.samples)
    x = to_model_input(store.images, record["mean"], record["std"])
    # (num_samples, tokens, dim), row i is the samples table's row i
    feats = batched_apply(lambda b: vit_prefix(backbone, b.to(device), start).cpu(), x)
    with atomic_path(args.output.features) as tmp:
        save_file({"features": feats.contiguous()}, str(tmp), metadata={"start": str(start), "rows": str(len(feats))})
    print(f"cached prefix features after {start} blocks: {tuple(feats.shape)}")


def load_rows(path: str | Path, rows: list[int]) -> torch.Tensor:
    """The cached features of these samples-table rows."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        feats = f.get_tensor("features")
    return feats[torch.tensor(rows, dtype=torch.long)]
