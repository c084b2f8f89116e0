"""train: fine-tune one model on one shard (or, for N = 1, on the whole training split)."""
from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq

from pipeline_src.backbone import load_backbone
from pipeline_src.datasets import to_model_input
from pipeline_src.methods import build_tuned_model, get_method
from pipeline_src.model_io import save_model
from pipeline_src.provenance import state_digest
from pipeline_src.runtime import resolve_device, set_up_job
from pipeline_src.sample_store import SampleStore
from pipeline_src.sharding import shard_ids
from pipeline_src.step_args import StepArgs
from pipeline_src.steps.features import load_rows
from pipeline_src.training import batched_apply


def train_settings(cfg: dict, method_cfg: dict) -> dict:
    """The study's `train:` settings, overridden by the method's own keys."""
    return {k: method_cfg.get(k, v) for k, v in cfg["train"].items()}


def main(args: StepArgs) -> None:
    cfg, w = args.config, args.wildcards
    name, shards, shard, seed = w["method"], int(w["shards"]), int(w["shard"]), int(w["seed"])
    method_cfg = cfg["methods"][name]
    settings = train_settings(cfg, method_cfg)
    set_up_job(args.threads, seed)
    device = resolve_device(cfg["device"])

    backbone, backbone_record = load_backbone(Path(args.input.backbone).parent)
    store = SampleStore(args.input.samples)
    ids = shard_ids(pq.read_table(args.input.manifest), shard)
    data = store.subset(ids)
    num_classes = store.num_classes("target")
    head_seed = cfg["seed"]  # one head init for every shard: soups and TAFT need a shared start
    model = build_tuned_model(backbone, method_cfg, num_classes, head_seed).to(device)

    t0 = time.perf_counter()
    if "features" in args.input._names:  # the frozen prefix was cached by the `features` rule
        features = load_rows(args.input.features, [store.row_of[i] for i in ids]).to(device)
    else:
        x = to_model_input(data.images, backbone_record["mean"], backbone_record["std"]).to(device)
        features = batched_apply(model.prefix, x)
    method = get_method(method_cfg["kind"])
    stats = method.train(model, features, data.labels.to(device), {**settings, "method": method_cfg},
                         seed * 1000 + shard, f"{name} n{shards} shard {shard}")
    record = {
        "kind": "trained", "method": name, "method_config": method_cfg, "train_settings": settings,
        "experiment": cfg["experiment"], "shards": shards, "shard_id": shard, "seed": seed, "head_seed": head_seed,
        "num_classes": num_classes, "backbone_digest": state_digest(backbone.state_dict()),
        "num_samples": len(ids), "sample_ids": ids, "device": str(device),
        "wall_time_s": time.perf_counter() - t0, **stats,
    }
    save_model(model.trainable_state(), record, args.output.model)
    print(f"trained {name} shard {shard}/{shards} on {len(ids)} samples: loss {stats['train_loss']:.4f}")
