"""Run one step in this fresh process and print its peak RSS (`ru_maxrss`, KiB) as the last line.

    python -m tests.steps.memory_probe STEP RESULTS IMAGE_FOLDER SHARDS

STEP is prepare, features (the `blocks` cache, float16) or train (a LAST shard job, shard 0 of
SHARDS, from that cache). Used by tests/steps/test_memory.py and benchmarks/bench_scale.py.
"""
from __future__ import annotations

import resource
import sys
from pathlib import Path


def main(step: str, results: Path, root: Path, shards: int) -> None:
    import pyarrow.parquet as pq
    import torch

    from pipeline_src.data import images
    from pipeline_src.plan.forget import train_ids
    from pipeline_src.plan.sharding import shard_manifest
    from pipeline_src.steps import features
    from tests.steps.helpers import folder_config, run_features, run_prepare, step_args, write_backbone

    torch.set_num_threads(1)
    # Batches full at both dataset sizes compared: a step's memory is then its batch's, whatever the size.
    images.CHUNK, features.BATCH = 32, 32
    cfg = folder_config(root, dataset={"source": "imagefolder", "path": str(root), "img_size": 224, "in_chans": 3},
                        features={"dtype": "float16"})
    samples = results / "prepare" / "samples.parquet"
    if step == "prepare":
        run_prepare(cfg, results)
        write_backbone(results / "pretrain", img_size=224, patch_size=16, embed_dim=64)
    elif step == "features":
        run_features(cfg, results, "blocks", everys=[1])
    elif step == "train":
        from pipeline_src.steps import train

        manifest = results / "split" / "manifest.parquet"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(shard_manifest(train_ids(pq.read_table(samples)), shards, cfg["seed"]), manifest)
        out = results / "train" / "shard0.safetensors"
        train.main(step_args(cfg, inputs={"samples": samples, "backbone": results / "pretrain" / "model.safetensors",
                                          "manifest": manifest, "features": results / "features" / "blocks" / "features.npy"},
                             outputs={"model": out, "record": out.with_suffix(".json")},
                             wildcards={"method": "last", "shards": str(shards), "seed": "0", "shard": "0"}))
    else:
        raise SystemExit(f"unknown step {step}")
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
