"""features: cache frozen-backbone features once per backbone and cache kind (`last{k}`:
the input of the last k blocks; `blocks`: every block's output, for LAST), for every sample, so shard jobs never rerun the frozen blocks."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.images import to_model_input
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.data.vit_parts import vit_prefix
from pipeline_src.last.features import extract_features
from pipeline_src.methods.training import batched_apply
from pipeline_src.runner.runtime import resolve_device, set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import atomic_path


def main(args: StepArgs) -> None:
    cfg = args.config
    set_up_job(args.threads, cfg["seed"])
    device = resolve_device(cfg["device"])
    backbone, record = load_backbone(Path(args.input.backbone).parent)
    backbone.to(device)
    cache = args.wildcards["cache"]
    if cache == "blocks":  # LAST: (num_samples, depth + 1, tokens, dim)
        fn = lambda b: torch.stack(extract_features(backbone, b.to(device), every=1), dim=1).cpu()  # noqa: E731
    else:  # tokens entering the last k blocks: (num_samples, tokens, dim)
        start = len(backbone.blocks) - int(cache.removeprefix("last"))
        fn = lambda b: vit_prefix(backbone, b.to(device), start).cpu()  # noqa: E731
    store = SampleStore(args.input.samples)
    feats = batched_apply(fn, to_model_input(store.images, record["mean"], record["std"]))  # row i = samples row i
    with atomic_path(args.output.features) as tmp:
        save_file({"features": feats.contiguous()}, str(tmp), metadata={"cache": cache, "rows": str(len(feats))})
    print(f"cached features '{cache}': {tuple(feats.shape)}")


def load_rows(path: str | Path, rows: list[int]) -> torch.Tensor:
    """The cached features of these samples-table rows."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        feats = f.get_tensor("features")
    return feats[torch.tensor(rows, dtype=torch.long)]
