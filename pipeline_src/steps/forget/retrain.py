"""unlearn_retrain: forget a random request by retraining only the affected shards, then recompose.

`retrain-shard` (SISA's exact unlearning, Bourtoule et al., IEEE S&P 2021): each shard holding a
forgotten id is retrained from scratch on its remaining samples, with the seed the `train` step
used; the untouched shards are reused. The shards are recomposed as the `compose` step does
(Δw sum for taft: Liu, Soatto et al., ICLR 2024; the soup otherwise), and for non-linear kinds
their logit ensemble is evaluated too (`sisa-retrain`). The unlearned models are saved with
records naming their components and exact sample ids, for `python -m pipeline_src.store.audit`; their per-image test correctness goes to the rule's
`per_image` output (`store/per_image.py`).
"""
from __future__ import annotations

import time
from pathlib import Path

from pipeline_src.methods.composition import ensemble_logits
from pipeline_src.methods.kinds import kind_of
from pipeline_src.plan.forget import random_request
from pipeline_src.runner.runtime import set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.forget.common import TestSet, compose, load_context, study_images, study_rows, train_on_ids
from pipeline_src.store.metrics import write_metrics
from pipeline_src.store.model_io import load_model, save_model
from pipeline_src.store.per_image import per_image_output, write_per_image


def main(args: StepArgs) -> None:
    w = args.wildcards
    shards, seed, fraction, request = int(w["shards"]), int(w["seed"]), float(w["fraction"]), int(w["request"])
    set_up_job(args.threads, seed)
    ctx = load_context(args)
    loaded = sorted(((p, *load_model(p)) for p in args.input.models), key=lambda x: x[2]["shard_id"])
    paths = [p for p, _, _ in loaded]
    states = [s for _, s, _ in loaded]
    records = [r for _, _, r in loaded]
    forgotten = random_request([i for r in records for i in r["sample_ids"]], fraction, seed, request)
    drop = set(forgotten)
    out_dir = Path(args.output.models)
    out_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    affected = [k for k, r in enumerate(records) if drop.intersection(r["sample_ids"])]
    for k in affected:
        kept = [i for i in records[k]["sample_ids"] if i not in drop]
        states[k], records[k] = train_on_ids(
            ctx, kept, seed * 1000 + records[k]["shard_id"], f"{ctx.method} n{shards} retrain shard {k}",
            shards=shards, shard_id=records[k]["shard_id"], seed=seed, strategy="retrain-shard",
            retrained_from=paths[k], forgotten_ids=sorted(drop.intersection(records[k]["sample_ids"])))
        paths[k] = str(out_dir / f"shard{records[k]['shard_id']}.safetensors")
        save_model(states[k], records[k], paths[k])
    composed, weights, composition = compose(ctx, states, records)
    seconds = time.perf_counter() - t0
    train_seconds = sum(records[k]["train_time_s"] for k in affected)

    save_model(composed, {
        "kind": "unlearned", "strategy": "retrain-shard", "composition": composition, "method": ctx.method,
        "method_config": ctx.method_cfg, "experiment": ctx.cfg["experiment"], "shards": shards, "seed": seed,
        "head_seed": ctx.head_seed, "num_classes": ctx.num_classes, "backbone_digest": records[0]["backbone_digest"],
        "linearization_id": records[0].get("linearization_id"), "weights": weights, "forgotten_ids": forgotten,
        "components": [{"path": p, "shard_id": r["shard_id"], "num_samples": r["num_samples"], "retrained": k in affected}
                       for k, (p, r) in enumerate(zip(paths, records))],
        "sample_ids": sorted(i for r in records for i in r["sample_ids"]),
    }, out_dir / "composed.safetensors")

    test = TestSet(ctx)
    variant = {"strategy": "retrain-shard", "fraction": fraction, "request": request, "affected": affected}
    stats = {"unlearn_time_s": seconds, "train_time_s": train_seconds, "forgotten": len(forgotten),
             "affected_shards": len(affected), "retrained_samples": sum(records[k]["num_samples"] for k in affected)}
    logits = {"retrain-shard": test.logits(composed)}
    if not kind_of(ctx.kind).tangent:  # the tangent composition already is the ensemble
        logits["sisa-retrain"] = ensemble_logits([test.logits(s) for s in states], weights)
    rows, images = [], []
    for model, model_logits in logits.items():
        values = test.metrics(model_logits)
        rows += study_rows(ctx, {**values, **stats}, model=model, shards=shards, seed=seed,
                           variant={**variant, "strategy": model}, num_samples=len(test.ids), wall_time_s=seconds)
        images += study_images(ctx, test, model_logits, model=model, shards=shards, seed=seed,
                               variant={**variant, "strategy": model})
        print(f"{ctx.method} n{shards} {model} f={fraction} q={request}: {len(forgotten)} ids in "
              f"{len(affected)} shards, accuracy {values['accuracy']:.4f}, retrain {train_seconds:.2f}s")
    write_per_image(images, per_image_output(args.output))
    write_metrics(rows, args.output.metrics)
