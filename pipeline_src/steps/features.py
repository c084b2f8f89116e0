"""features: cache frozen-backbone features once per backbone and cache kind (`last{k}`: the
input of the last k blocks; `blocks`: the embedding and the block outputs LAST reads), for every
sample, so shard jobs never rerun the frozen blocks.

Images are read and converted per batch and each batch's features are appended to a `.npy`
in `features.dtype` (`data/feature_cache.py`), so the job's memory does not
grow with the dataset. Shard jobs read their own rows, a batch at a time (`CachedRows`).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.feature_cache import FeatureCache, FeatureCacheWriter, to_storage
from pipeline_src.data.images import to_model_input
from pipeline_src.data.loader import image_batches
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.data.throughput import Throughput
from pipeline_src.job.counters import counting
from pipeline_src.last.features import block_outputs
from pipeline_src.methods.kinds import LAST_DEFAULTS
from pipeline_src.plan.feature_budget import kept_blocks
from pipeline_src.runner.runtime import resolve_device, set_up_job, use_bf16
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.vit.parts import vit_prefix

BATCH = 128


def main(args: StepArgs) -> None:
    cfg = args.settings
    set_up_job(args.threads, cfg["seed"])
    device = resolve_device(args.runtime["device"])
    backbone, record = load_backbone(Path(args.input.backbone).parent)
    backbone.to(device).eval()
    cache = args.wildcards["cache"]
    meta: dict = {"cache": cache, "depth": len(backbone.blocks)}
    if cache == "blocks":  # LAST: (num_samples, len(blocks), tokens, dim)
        blocks = kept_blocks(len(backbone.blocks), args.params.get("everys") or [LAST_DEFAULTS["every"]])
        meta["blocks"] = blocks
        fn = lambda b: block_outputs(backbone, b, blocks)  # one pass for every kept block  # noqa: E731
    else:  # tokens entering the last k blocks: (num_samples, tokens, dim)
        start = len(backbone.blocks) - int(cache.removeprefix("last"))
        fn = lambda b: vit_prefix(backbone, b, start)  # noqa: E731
    store = SampleStore(args.input.samples)
    n = len(store.image_array)
    dtype = cfg["features"]["dtype"]
    bf16 = use_bf16(cfg["train"]["precision"], device)
    batches = image_batches(store.image_array, range(n), BATCH, device, args.runtime["num_workers"])
    writer = None
    meter = Throughput(f"features '{cache}'")
    # One writer thread: batch k's file write overlaps batch k+1's forward (in order, two batches held)
    pool, pending = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-writer"), None
    try:
        with torch.no_grad():
            for k, images in enumerate(batches):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16), \
                        counting("features", len(images), device):  # the efficiency table's FLOPs
                    h = fn(to_model_input(images, record["mean"], record["std"]))
                if writer is None:
                    writer = FeatureCacheWriter(args.output.features, (n, *h.shape[1:]), dtype, meta)
                block = to_storage(h, dtype)  # cast on the device, then copied: row k * BATCH + i = samples row
                if pending is not None:
                    pending.result()
                pending = pool.submit(writer.write_stored, k * BATCH, block)
                meter.add(len(block))
        if pending is not None:
            pending.result()
        if writer is None:
            raise ValueError(f"features '{cache}': the prepared dataset {args.input.samples} has no samples")
        writer.close()
    except BaseException:
        pool.shutdown(wait=True)  # the file is closed only once no write is in flight
        if writer is not None:
            writer.abort()
        raise
    pool.shutdown()
    meter.report()
    print(f"cached features '{cache}': {tuple(writer.shape)} {dtype}"
          + (f", blocks {meta['blocks']}" if "blocks" in meta else ""))


def load_rows(path: str | Path, rows: Sequence[int], model: torch.nn.Module | None = None) -> torch.Tensor:
    """The cached features of these samples-table rows, float32, reading only those rows.

    Args:
        path: the cache's `features.npy`.
        rows: samples-table rows.
        model: the tuned model the features feed; a LAST model (`cache_blocks`) gets its own
            blocks of a `blocks` cache, in its order.
    """
    return FeatureCache(path).rows(rows, blocks=getattr(model, "cache_blocks", None))
