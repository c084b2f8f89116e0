"""evaluate_private: test accuracy and loss of a DP model (one shard model, the Δw sum of a
taft method's DP shards, or the logit ensemble of another kind's DP shards), with its ε.

Rows carry model `dp-shard`, `dp-soup` or `dp-ensemble`, the study settings as JSON in
`variant` (protocol, regime, target ε, δ, accountant, mode, jvp_only), and besides `accuracy` and
`loss` the metrics `epsilon` (ε spent, from the accountant; the worst shard's for a
composition of disjoint shards) and `sigma` (noise multiplier; shard models only). On the test
split, the model's per-image correctness goes to the rule's `per_image` output
(`store/per_image.py`, for the claims' paired test): test images only, which are never members,
and like every file of a DP study's workspace it is owner-only (docs/privacy.md).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline_src.data.feature_cache import CachedRows, FeatureCache
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.methods.composition import ensemble_logits
from pipeline_src.methods.evaluation import classification_metrics
from pipeline_src.methods.kinds import kind_of
from pipeline_src.methods.loading import load_tuned_model
from pipeline_src.methods.training import batched_apply
from pipeline_src.runner.runtime import resolve_device, set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.privacy.compose import composed_privacy
from pipeline_src.store.job_counters import counted
from pipeline_src.store.metrics import metric_rows, write_metrics
from pipeline_src.store.per_image import per_image_output, per_image_rows, write_per_image


def variant(record: dict) -> str:
    """The row's study settings as canonical JSON."""
    s, m = record["dp_settings"], record["method_config"]
    return json.dumps({"study": "privacy", "protocol": s.get("protocol", "ours"), "regime": record["regime"], "epsilon": record["privacy"]["epsilon"],
                       "delta": s["delta"], "accountant": s["accountant"], "mode": s["mode"],
                       "max_grad_norm": s["max_grad_norm"], "train_head": s.get("train_head"), "jvp_only": m.get("jvp_only") if kind_of(m).tangent else None},
                      sort_keys=True)


def main(args: StepArgs) -> None:
    cfg, w = args.settings, args.wildcards
    set_up_job(args.threads, int(w["seed"]))
    device = resolve_device(args.runtime["device"])
    t0 = time.perf_counter()
    store = SampleStore(args.input.samples)
    split = args.params.get("split", "test")  # `validate_private` (the DP search's candidates): "val"
    test = store.split("target", split)
    cached = "features" in args.input._names
    batch_size = args.runtime["eval_batch_size"]
    all_logits, records = [], []
    for path in args.input.models:
        model, record, backbone_record = load_tuned_model(Path(args.input.backbone).parent, path)
        model.to(device).eval()
        if cached:  # the prefix is frozen: the cached features are exactly its output, read a batch at a time
            feats = CachedRows(FeatureCache(args.input.features), test.rows, device,
                               blocks=getattr(model, "cache_blocks", None))  # the blocks this method reads (LAST)
            logits = batched_apply(counted("eval", model.forward_from_prefix, device), feats, batch_size)
        else:
            logits = store.apply(counted("eval", model, device), test.ids, backbone_record["mean"], backbone_record["std"], device,
                                 batch_size=batch_size)
        all_logits.append(logits.cpu())
        records.append(record)
    logits = all_logits[0] if len(all_logits) == 1 else ensemble_logits(all_logits)
    privacy = records[0]["privacy"] if len(records) == 1 else composed_privacy(records)
    values = {**classification_metrics(logits, test.labels), "epsilon": privacy["epsilon_spent"]}
    if "sigma" in privacy:
        values["sigma"] = privacy["sigma"]
    record = records[0]
    context = dict(
        experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method=w["method"],
        kind=record["method_config"]["kind"], model=args.params["model"], variant=variant(record),
        shards=int(w["shards"]), shard_id=args.params.get("shard_id"), seed=int(w["seed"]), split=split,
        num_samples=len(test.ids),
    )
    if split == "test":  # the claims' paired tests; `validate_private` declares no per-image file
        write_per_image(per_image_rows(logits, test.labels, test.ids, context), per_image_output(args.output))
    write_metrics(metric_rows(values, context=context, device=device, wall_time_s=time.perf_counter() - t0),
                  args.output.metrics)
    print(f"{w['protocol']} {w['method']} {w['regime']} eps {w['eps']} n{w['shards']} {args.params['model']}: "
          + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
