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
from pathlib import Path

import pyarrow.parquet as pq

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.images import to_model_input
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.methods.fusion_models import reinit_method_config, reinit_tuned
from pipeline_src.methods.registry import build_tuned_model, get_method
from pipeline_src.methods.training import batched_apply
from pipeline_src.plan.sharding import shard_ids
from pipeline_src.runner.runtime import resolve_device, set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.features import load_rows
from pipeline_src.steps.train import train_settings
from pipeline_src.store.model_io import save_model
from pipeline_src.store.provenance import state_digest


def reinit_seed(seed: int, shard: int) -> int:
    return seed * 1000 + shard + 1


def main(args: StepArgs) -> None:
    cfg, w = args.config, args.wildcards
    name, shards, shard, seed = w["method"], int(w["shards"]), int(w["shard"]), int(w["seed"])
    r_seed = reinit_seed(seed, shard)
    method_cfg = reinit_method_config(cfg["methods"][name], r_seed)
    settings = train_settings(cfg, method_cfg)
    set_up_job(args.threads, seed)
    device = resolve_device(cfg["device"])

    backbone, backbone_record = load_backbone(Path(args.input.backbone).parent)
    store = SampleStore(args.input.samples)
    ids = shard_ids(pq.read_table(args.input.manifest), shard)
    data = store.subset(ids)
    num_classes = store.num_classes("target")
    head_seed = cfg["seed"]
    model = build_tuned_model(backbone, method_cfg, num_classes, head_seed)
    reinit_tuned(model, method_cfg, r_seed)
    model.to(device)

    t0 = time.perf_counter()
    if "features" in args.input._names:  # reinit touches only tuned blocks: the cached prefix holds
        features = load_rows(args.input.features, [store.row_of[i] for i in ids], model).to(device)
    else:
        x = to_model_input(data.images, backbone_record["mean"], backbone_record["std"]).to(device)
        features = batched_apply(model.prefix, x)
    stats = get_method(method_cfg["kind"]).train(model, features, data.labels.to(device),
                                                 {**settings, "method": method_cfg}, seed * 1000 + shard,
                                                 f"{name} random_reinit n{shards} shard {shard}")
    record = {
        "kind": "trained", "method": name, "method_config": method_cfg, "train_settings": settings,
        "experiment": cfg["experiment"], "shards": shards, "shard_id": shard, "seed": seed, "head_seed": head_seed,
        "init": "random_reinit", "reinit_seed": r_seed,
        "num_classes": num_classes, "backbone_digest": state_digest(backbone.state_dict()),
        "num_samples": len(ids), "sample_ids": ids, "device": str(device),
        "wall_time_s": time.perf_counter() - t0, **stats,
    }
    save_model(model.trainable_state(), record, args.output.model)
    print(f"trained {name} (random_reinit seed {r_seed}) shard {shard}/{shards} on {len(ids)} samples: "
          f"loss {stats['train_loss']:.4f}")
