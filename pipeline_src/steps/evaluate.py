"""evaluate: accuracy and loss on the test split (the `validate` rule: the validation split) of one
model, or of a method's N shard models.

Rule `evaluate_soup` (params `model: soup`) evaluates its one input model as itself. Rule
`evaluate_shards` (params `model: shards`) evaluates the N shard models of one (method, N, seed)
in one job: one row set per shard model (`model` shard, its `shard_id`), as N separate jobs
wrote them, and, with params `ensemble` true, the rows of their ensemble: the mean of their
logits weighted by `compose_weights`, the soup's weights (so a TAFT soup and its ensemble are
one function). Both come from one pass over the test split with one frozen-prefix pass per batch
(`methods/shared_prefix.py`: for LAST one backbone pass for all side networks), and the models
share one copy of the frozen backbone. Images are read and converted `train.eval_batch_size` at
a time, so the job's memory stops growing with the test split once the split fills one batch.
Beside the test split's metrics file, every evaluated model's per-image correctness goes to the
rule's `per_image` output, the same path under `per_image/` (`store/per_image.py`): the claims'
paired tests resample it.
Each single model also gets `weight_distance`, the L2 distance of its trained tensors from their
starting values (TAFT Fig. 4; `methods/weight_distance.py`).
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
from pipeline_src.store.per_image import per_image_output, per_image_rows, write_per_image

MODES = ("shards", "soup", "ensemble")  # `ensemble` alone: the ensemble rows without the shard rows


def shard_ids_of(records: list[dict], paths: list[str]) -> list[int]:
    """Each shard model's `shard_id` from its record, checked to be distinct.

    Args:
        records: the models' records, in input order.
        paths: their files, named in the error.
    """
    ids = [r.get("shard_id") for r in records]
    if any(i is None for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"evaluate: the shard models {paths} do not carry distinct `shard_id`s in their records: {ids}")
    return [int(i) for i in ids]


def main(args: StepArgs) -> None:
    cfg, w = args.settings, args.wildcards
    mode = args.params["model"]
    if mode not in MODES:
        raise ValueError(f"evaluate: params model '{mode}' is none of {MODES}")
    set_up_job(args.threads, int(w["seed"]))
    device = resolve_device(args.runtime["device"])
    t0 = time.perf_counter()
    store = SampleStore(args.input.samples)
    split = args.params.get("split", "test")  # `validate` (the search's candidates): "val"
    test = store.split("target", split)
    backbone_dir = Path(args.input.backbone).parent
    paths = [str(p) for p in args.input.models]
    loaded = load_backbone(backbone_dir)  # once per job: each model builds on a copy of it
    models, records = [], []
    for path in paths:
        model, record, backbone_record = load_tuned_model(backbone_dir, path, backbone=loaded)
        models.append(model.to(device).eval())
        records.append(record)
        share_frozen_tensors([models[0], models[-1]])  # N shard models hold one copy of the frozen backbone
    if any(r["method_config"] != record["method_config"] for r in records):
        raise ValueError(f"evaluate: the models {paths} differ in their method settings; "
                         "shard models evaluated together are of one method")

    def logits_of(x: torch.Tensor) -> torch.Tensor:  # (B, models, classes); one prefix pass for all models
        with counting("eval", len(x), device):
            return member_logits(models, x).cpu()

    # Images are read from the store and converted one batch at a time.
    out = store.apply(logits_of, test.ids, backbone_record["mean"], backbone_record["std"], device,
                      batch_size=args.runtime["eval_batch_size"], workers=args.runtime["num_workers"])
    # (model, shard_id, values, logits (images, classes))
    results: list[tuple[str, int | None, dict[str, float], torch.Tensor]] = []
    if mode == "soup":
        values = classification_metrics(out[:, 0], test.labels)
        values["weight_distance"] = distance_from_start(backbone_dir, paths[0], backbone=loaded)
        results.append(("soup", None, values, out[:, 0]))
    if mode == "shards":
        starts: dict = {}  # the shard models' one start, built once
        for i, (shard, path) in enumerate(zip(shard_ids_of(records, paths), paths)):
            values = classification_metrics(out[:, i], test.labels)
            values["weight_distance"] = distance_from_start(backbone_dir, path, backbone=loaded, starts=starts)
            results.append(("shard", shard, values, out[:, i]))
    if mode == "ensemble" or args.params.get("ensemble"):
        logits = ensemble_logits(list(out.unbind(1)), composition_weights(records, cfg["compose_weights"]))
        results.append(("ensemble", None, classification_metrics(logits, test.labels), logits))
    wall = time.perf_counter() - t0
    rows, images = [], []
    for model_name, shard, values, logits in results:
        context = dict(
            experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method=w["method"],
            kind=record["method_config"]["kind"], model=model_name, shards=int(w["shards"]),
            shard_id=shard, seed=int(w["seed"]), split=split, num_samples=len(test.ids),
        )
        rows += metric_rows(values, context=context, device=device, wall_time_s=wall)
        images += per_image_rows(logits, test.labels, test.ids, context)  # the claims' paired tests
        label = model_name if shard is None else f"shard {shard}"
        print(f"{w['method']} n{w['shards']} {label}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
    if split == "test":  # the claims' tests read test images only; `validate` declares no per-image file
        write_per_image(images, per_image_output(args.output))
    write_metrics(rows, args.output.metrics)
