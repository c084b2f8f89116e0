"""Run steps and print each one's peak RSS (`ru_maxrss`, KiB), as JSON on the last line.

    python -m tests.steps.memory_probe STEP RESULTS IMAGE_FOLDER SHARDS [STEP RESULTS IMAGE_FOLDER SHARDS ...]

STEP is prepare, features (the `blocks` cache, float16) or train (a LAST shard job, shard 0 of
SHARDS, from that cache). This process imports torch, timm and the steps once; each step runs in
a child forked from it (as the fork server runs jobs), so every step starts from the same
resident baseline and its `ru_maxrss` is its own peak. Used by tests/steps/test_memory.py.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from pathlib import Path


def run_step(step: str, results: Path, root: Path, shards: int) -> None:
    import pyarrow.parquet as pq

    from pipeline_src.plan.forget import train_ids
    from pipeline_src.plan.sharding import shard_manifest
    from tests.steps.helpers import folder_config, run_features, run_prepare, step_args, write_backbone

    cfg = folder_config(root, dataset={"source": "imagefolder", "path": str(root), "img_size": 224, "in_chans": 3},
                        features={"dtype": "float16"},
                        methods={"last": {"kind": "last", "rank": 4, "heads": 2, "every": 1}})  # reads all 5 blocks
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


def forked_peak(job: tuple[str, Path, Path, int]) -> int:
    """Run one step in a forked child; its peak RSS in KiB (a failed step raises)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, exit without running the parent's cleanup
        os.close(r)
        code = 1
        try:
            run_step(*job)
            os.write(w, str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not out:
        raise SystemExit(f"memory_probe: step {job[0]} on {job[2]} failed (status {status})")
    return int(out)


def main(jobs: list[tuple[str, Path, Path, int]]) -> None:
    import torch

    import pipeline_src.steps.prepare  # noqa: F401  (imported once, before the forks)
    import pipeline_src.steps.train  # noqa: F401
    from pipeline_src.data import images
    from pipeline_src.steps import features

    torch.set_num_threads(1)
    # Batches full at both dataset sizes compared: a step's memory is then its batch's, whatever the size.
    images.CHUNK, features.BATCH = 32, 32
    print(json.dumps([forked_peak(job) for job in jobs]))


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 4:
        raise SystemExit(__doc__)
    main([(args[i], Path(args[i + 1]), Path(args[i + 2]), int(args[i + 3])) for i in range(0, len(args), 4)])
