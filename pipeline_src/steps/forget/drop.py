"""unlearn_drop: forget by removing shards, no training (Figure 1a/b of the TAFT paper).

- `subtract` (taft): subtract the removed shards' Δw from the composed tangent model with
  renormalised weights (Liu, Soatto et al., ICLR 2024, §3.3); saved with its record.
- `sisa-drop` (other kinds): the ensemble of the remaining shard models' logits (Bourtoule et
  al., "Machine Unlearning", IEEE S&P 2021).

For each number r of removed shards and each of the random requests, the same random shard
set is removed for every method (seeded by seed, request, r and N). Besides the metrics, each
model's per-image correctness on the test split (`store/per_image.py`), for the claims' paired test.
"""
from __future__ import annotations

import time
from pathlib import Path

from pipeline_src.methods.composition import composition_weights, ensemble_logits, subtract_shards
from pipeline_src.methods.kinds import kind_of
from pipeline_src.plan.forget import random_shards
from pipeline_src.runner.runtime import set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.forget.common import TestSet, load_context, study_images, study_rows
from pipeline_src.store.metrics import write_metrics
from pipeline_src.store.model_io import load_model, save_model
from pipeline_src.store.per_image import per_image_output, write_per_image


def main(args: StepArgs) -> None:
    w = args.wildcards
    shards, seed = int(w["shards"]), int(w["seed"])
    set_up_job(args.threads, seed)
    ctx = load_context(args)
    test = TestSet(ctx)
    loaded = [load_model(p) for p in args.input.models]
    states = {r["shard_id"]: s for s, r in loaded}
    paths = {r["shard_id"]: p for p, (_, r) in zip(args.input.models, loaded)}
    records = {r["shard_id"]: r for _, r in loaded}
    out_dir = Path(args.output.models)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, images = [], []
    if kind_of(ctx.kind).tangent:
        composed, comp_record = load_model(args.input.composed)
        order = [c["shard_id"] for c in comp_record["components"]]
        strategy = "subtract"
    else:
        shard_logits = {i: test.logits(s) for i, s in states.items()}
        order = sorted(states)
        shard_weights = dict(zip(order, composition_weights([records[i] for i in order], ctx.cfg["compose_weights"])))
        strategy = "sisa-drop"
    points = [(0, 0)] + [(r, j) for r in args.params["removed_shards"] for j in range(args.params["requests"])]
    for removed_count, request in points:
        removed = random_shards(shards, removed_count, seed, request) if removed_count else []
        t0 = time.perf_counter()
        if strategy == "subtract":
            state, kept, weights = subtract_shards(composed, states, comp_record["weights"], order, removed)
            seconds = time.perf_counter() - t0
            logits = test.logits(state)
            kept_ids = sorted(i for k in kept for i in records[k]["sample_ids"])
            save_model(state, {
                "kind": "unlearned", "strategy": "subtract", "method": ctx.method, "method_config": ctx.method_cfg,
                "experiment": ctx.cfg["experiment"], "shards": shards, "seed": seed, "head_seed": ctx.head_seed,
                "num_classes": ctx.num_classes, "backbone_digest": comp_record["backbone_digest"],
                "linearization_id": comp_record.get("linearization_id"), "weights": weights,
                "source": args.input.composed,
                "components": [{"path": paths[k], "shard_id": k, "num_samples": records[k]["num_samples"]}
                               for k in kept],
                "removed_components": [{"path": paths[k], "shard_id": k} for k in removed],
                "sample_ids": kept_ids,
            }, out_dir / f"r{removed_count}_q{request}.safetensors")
        else:
            kept = [i for i in sorted(states) if i not in removed]
            logits = ensemble_logits([shard_logits[i] for i in kept], [shard_weights[i] for i in kept])
            seconds = time.perf_counter() - t0
        variant = {"strategy": strategy, "removed_shards": removed_count, "request": request, "removed": removed}
        values = {**test.metrics(logits), "unlearn_time_s": seconds}
        rows += study_rows(ctx, values, model=strategy, shards=shards, seed=seed, variant=variant,
                           num_samples=len(test.ids), wall_time_s=seconds)
        images += study_images(ctx, test, logits, model=strategy, shards=shards, seed=seed, variant=variant)
        print(f"{ctx.method} n{shards} {strategy} r={removed_count} q={request} removed {removed}: "
              f"accuracy {values['accuracy']:.4f}")
    write_per_image(images, per_image_output(args.output))  # the claims pair subtract and SISA drop per request
    write_metrics(rows, args.output.metrics)
