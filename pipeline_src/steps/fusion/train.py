"""fusion_train: a shard model whose tuned blocks start from a per-shard random init.

The fusion study's `random_reinit` setting (Zhang et al., "Beyond the Permutation Symmetry of
Transformers: The Role of Rotation for Model Fusion", ICML 2025, fuse models trained from
different inits, where matching matters most). Training is the `train` step's: the same
settings, head seed, shard data and training seed (seed·1000 + shard), but
  * nlft: the last k blocks are re-initialized from `reinit_seed` (the final norm and head keep
    the shared start);
  * last: the side network is initialized from `init_seed = reinit_seed` instead of the shared one.
reinit_seed = seed·1000 + shard + 1, recorded in the model's record.
"""
from __future__ import annotations

import time

from pipeline_src.methods.fusion_models import reinit_method_config, reinit_tuned
from pipeline_src.methods.registry import get_method
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.train import load_job, shard_seed


def reinit_seed(seed: int, shard: int) -> int:
    return seed * 1000 + shard + 1


def main(args: StepArgs) -> None:
    shard, seed = int(args.wildcards["shard"]), int(args.wildcards["seed"])
    r_seed = reinit_seed(seed, shard)
    job = load_job(args, reinit_method_config(args.settings["methods"][args.wildcards["method"]], r_seed))
    model = job.new_model()
    reinit_tuned(model, job.method_cfg, r_seed)
    t0 = time.perf_counter()
    # reinit touches only tuned blocks, so the cached frozen prefix still holds
    ids, features, labels = job.shard_data(model, shard)
    stats = get_method(job.method_cfg["kind"]).train(model, features, labels, {**job.settings, "method": job.method_cfg},
                                                     shard_seed(seed, shard),
                                                     f"{job.name} random_reinit n{job.shards} shard {shard}")
    job.save(model.trainable_state(), shard, ids, stats, time.perf_counter() - t0, args.output.model,
             extra={"init": "random_reinit", "reinit_seed": r_seed})
