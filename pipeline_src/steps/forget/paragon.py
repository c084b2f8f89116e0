"""unlearn_paragon: the paragon of unlearning, a model retrained on the whole training set minus
the forgotten ids (Bourtoule et al., "Machine Unlearning", IEEE S&P 2021: the cost SISA avoids).

The request is drawn exactly as `unlearn_retrain` draws it (same ids, fraction, seed and request
number), from the sample ids of the DAG's full-data model (`train/{method}/n1_s{seed}/shard0`).
"""
from __future__ import annotations

from pipeline_src.plan.forget import random_request
from pipeline_src.runner.runtime import set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.forget.common import TestSet, load_context, study_rows, train_on_ids
from pipeline_src.store.metrics import write_metrics
from pipeline_src.store.model_io import load_model, save_model


def main(args: StepArgs) -> None:
    w = args.wildcards
    seed, fraction, request = int(w["seed"]), float(w["fraction"]), int(w["request"])
    set_up_job(args.threads, seed)
    ctx = load_context(args)
    _, full = load_model(args.input.full)
    forgotten = random_request(full["sample_ids"], fraction, seed, request)
    drop = set(forgotten)
    kept = [i for i in full["sample_ids"] if i not in drop]
    state, record = train_on_ids(ctx, kept, seed * 1000, f"{ctx.method} paragon f={fraction} q={request}",
                                 shards=1, shard_id=0, seed=seed, strategy="paragon", forgotten_ids=forgotten)
    save_model(state, record, args.output.model)
    test = TestSet(ctx)
    values = {**test.metrics(test.logits(state)), "unlearn_time_s": record["train_time_s"],
              "train_time_s": record["train_time_s"], "forgotten": len(forgotten), "retrained_samples": len(kept)}
    variant = {"strategy": "paragon", "fraction": fraction, "request": request}
    write_metrics(study_rows(ctx, values, model="paragon", shards=1, seed=seed, variant=variant,
                             num_samples=len(test.ids), wall_time_s=record["train_time_s"]), args.output.metrics)
    print(f"{ctx.method} paragon f={fraction} q={request}: {len(kept)} samples, accuracy {values['accuracy']:.4f}, "
          f"train {record['train_time_s']:.2f}s")
