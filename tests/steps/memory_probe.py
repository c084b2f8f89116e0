"""Run steps and print each one's peak RSS (`ru_maxrss`, KiB), as JSON on the last line.

    python -m tests.steps.memory_probe STEP RESULTS IMAGE_FOLDER SHARDS [STEP RESULTS IMAGE_FOLDER SHARDS ...]

STEP is prepare, features (the `blocks` cache, float16), train (a LAST shard job, shard 0 of
SHARDS, from that cache), fusion_match (that model and a copy matched to it: two shard models),
fuse (RegMean of the two matched models: Grams over both shards, then the test split) or
train_private (DP-SGD of the LAST model, bk clipping, shard 0, from the cache). This process imports torch, timm and the steps once; each step runs in
a child forked from it (as the fork server runs jobs), so every step starts from the same
resident baseline and its `ru_maxrss` is its own peak. Used by tests/steps/test_memory.py.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path


def run_step(step: str, results: Path, root: Path, shards: int) -> None:
    import pyarrow.parquet as pq

    from pipeline_src.plan.forget import train_ids
    from pipeline_src.plan.samples import count_train_samples
    from pipeline_src.plan.sharding import shard_manifest
    from tests.steps.helpers import folder_config, run_features, run_prepare, step_args, write_backbone

    settings = dict(dataset={"source": "imagefolder", "path": str(root), "img_size": 224, "in_chans": 3},
                    features={"dtype": "float16"},
                    methods={"last": {"kind": "last", "rank": 4, "heads": 2, "every": 1}},  # reads all 5 blocks
                    shards=[1, 2], fusion={"enabled": True, "shards": [2]})
    n_train = count_train_samples(folder_config(root, **settings))  # the probe declares the true size public
    cfg = folder_config(root, privacy={"enabled": True, "epsilons": [8], "epochs": 1, "batch_size": 16,
                                       "regimes": ["full"], "public_train_size": n_train}, **settings)
    cfg["train"]["eval_batch_size"] = 16  # full test batches at both sizes (30 and 120 test images)
    samples = results / "prepare" / "samples.parquet"
    common = {"samples": samples, "backbone": results / "pretrain" / "model.safetensors",
              "features": results / "features" / "blocks" / "features.npy"}
    wild = {"method": "last", "shards": "2", "seed": "0", "init": "shared", "matching": "rotation"}
    shard0 = results / "train" / "shard0.safetensors"
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
    elif step == "fusion_match":
        from pipeline_src.steps.fusion import match

        copy = results / "train" / "copy" / "shard1.safetensors"  # a second shard model (the same shard's)
        copy.parent.mkdir(parents=True, exist_ok=True)
        for suffix in (".safetensors", ".json"):  # the model and its record
            copy.with_suffix(suffix).write_bytes(shard0.with_suffix(suffix).read_bytes())
        args = step_args(cfg, inputs=common, outputs={"models": results / "matched", "metrics": results / "match.parquet"},
                         wildcards=wild, rule="fusion_match")
        args.input._names["models"] = [str(shard0), str(copy)]  # a list input, as the rule's
        match.main(args)
    elif step == "fuse":
        from pipeline_src.steps.fusion import fuse

        fused = results / "fused" / "model.safetensors"
        fuse.main(step_args(cfg, inputs={**common, "models": results / "matched"},
                            outputs={"model": fused, "metrics": results / "fuse.parquet"},
                            wildcards={**wild, "fusion": "regmean"}, rule="fuse"))
    elif step == "train_private":
        import torch

        from pipeline_src.dp import private_training
        from pipeline_src.plan.privacy import target_epsilon
        from pipeline_src.steps.privacy import train as private_train

        # Replayable coins in this probe only: the peak follows the largest Poisson batch drawn,
        # which the secret generators would make differ from run to run.
        coins = iter(range(2))
        private_training.secret_generator = lambda device: torch.Generator(device).manual_seed(next(coins))

        private_train.main(step_args(cfg, inputs={**common, "manifest": results / "split" / "manifest.parquet"},
                                     outputs={"model": results / "private" / "model.safetensors"},
                                     params={"epsilon": target_epsilon(cfg, "8")}, rule="train_private",
                                     wildcards={"method": "last", "regime": "full", "shards": str(shards), "shard": "0",
                                                "seed": "0", "eps": "8", "protocol": "ours"}))
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
            from pipeline_src.runner.execute import job_allocator

            job_allocator()  # glibc's settings of a real job (`runner/execute.py`)
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
    peaks = []
    for job in jobs:
        t0 = time.perf_counter()
        peaks.append(forked_peak(job))
        print(f"{job[0]} on {job[2].name}: peak RSS {peaks[-1] / 1024:.0f} MB, {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
    print(json.dumps(peaks))


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 4:
        raise SystemExit(__doc__)
    main([(args[i], Path(args[i + 1]), Path(args[i + 2]), int(args[i + 3])) for i in range(0, len(args), 4)])
