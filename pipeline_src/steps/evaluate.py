"""evaluate: accuracy and loss on the test split (the `validate` rule: the validation split), one
Parquet file per evaluated model.

One input model is evaluated as itself; several are evaluated as their ensemble: the mean of
their logits weighted by `compose_weights`, the soup's weights (so a TAFT soup and its ensemble
are one function), from one pass of their shared frozen prefix per batch
(`methods/shared_prefix.py`: for LAST, one backbone pass for all side networks instead of one each).
Images are read and converted `train.eval_batch_size` at a time, so the job's memory stops
growing with the test split once the split fills one batch. A single model also gets
`weight_distance`, the L2 distance of its trained tensors from their starting values (TAFT Fig. 4;
`methods/weight_distance.py`).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.methods.composition import composition_weights, ensemble_logits
from pipeline_src.methods.evaluation import classification_metrics
from pipeline_src.methods.loading import load_tuned_model
from pipeline_src.methods.shared_prefix import member_logits, share_frozen_tensors
from pipeline_src.methods.weight_distance import distance_from_start
from pipeline_src.runner.runtime import resolve_device, set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.job_counters import counting
from pipeline_src.store.metrics import metric_rows, write_metrics


def main(args: StepArgs) -> None:
    cfg, w = args.settings, args.wildcards
    set_up_job(args.threads, int(w["seed"]))
    device = resolve_device(args.runtime["device"])
    t0 = time.perf_counter()
    store = SampleStore(args.input.samples)
    split = args.params.get("split", "test")  # `validate` (the search's candidates): "val"
    rows = store.split("target", split)
    backbone_dir = Path(args.input.backbone).parent
    loaded = load_backbone(backbone_dir)  # once per job: each model builds on a copy of it
    models, records = [], []
    for path in args.input.models:
        model, record, backbone_record = load_tuned_model(backbone_dir, path, backbone=loaded)
        models.append(model.to(device).eval())
        records.append(record)
        share_frozen_tensors([models[0], models[-1]])  # N shard models hold one copy of the frozen backbone
    if any(r["method_config"] != record["method_config"] for r in records):
        raise ValueError(f"evaluate: the models {list(args.input.models)} differ in their method settings; "
                         "an ensemble is of one method's shard models")

    def logits_of(x: torch.Tensor) -> torch.Tensor:  # (B, models, classes); one prefix pass for all models
        with counting("eval", len(x), device):
            return member_logits(models, x).cpu()

    # Images are read from the store and converted one batch at a time.
    out = store.apply(logits_of, rows.ids, backbone_record["mean"], backbone_record["std"], device,
                      batch_size=args.runtime["eval_batch_size"], workers=args.runtime["num_workers"])
    logits = out[:, 0] if len(models) == 1 else \
        ensemble_logits(list(out.unbind(1)), composition_weights(records, cfg["compose_weights"]))
    values = classification_metrics(logits, rows.labels)
    if len(args.input.models) == 1:
        values["weight_distance"] = distance_from_start(backbone_dir, args.input.models[0], backbone=loaded)
    context = dict(
        experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method=w["method"],
        kind=record["method_config"]["kind"], model=args.params["model"], shards=int(w["shards"]),
        shard_id=args.params.get("shard_id"), seed=int(w["seed"]), split=split, num_samples=len(rows.ids),
    )
    write_metrics(metric_rows(values, context=context, device=device, wall_time_s=time.perf_counter() - t0),
                  args.output.metrics)
    print(f"{w['method']} n{w['shards']} {args.params['model']}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
