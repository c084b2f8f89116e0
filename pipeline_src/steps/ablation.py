"""ablation: one variant of a taft method (TAFT Fig. 2 / Table 12, `plan/ablations.py`) trained
on the whole training split exactly as the `train` step trains a method, and evaluated on test.

Rows: model `ablation`, `variant` the JSON of the point (figure, loss, reset, reset_cls or radius,
l2); metrics accuracy, loss and weight_distance (‖Δw‖, TAFT Fig. 4's quantity).
"""
from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq

from pipeline_src.methods.weight_distance import state_distance
from pipeline_src.plan.ablations import point_variant
from pipeline_src.plan.sharding import shard_ids
from pipeline_src.runner.runtime import set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.forget.common import TestSet, load_context, study_rows, train_on_ids
from pipeline_src.steps.train import shard_seed
from pipeline_src.store.metrics import write_metrics


def main(args: StepArgs) -> None:
    w = args.wildcards
    seed, label = int(w["seed"]), w["variant"]
    set_up_job(args.threads, seed)
    ctx = load_context(args)
    point = args.params["point"]  # this variant's point of `plan.ablations.ablation_points` (the rule's param)
    method_cfg = {**ctx.method_cfg, **point["overrides"]}
    ctx = dataclasses.replace(ctx, cfg={**ctx.cfg, "methods": {**ctx.cfg["methods"], ctx.method: method_cfg}})
    ids = shard_ids(pq.read_table(args.input.manifest), 0)
    state, record = train_on_ids(ctx, ids, shard_seed(seed, 0), f"{ctx.method} ablation {label}", shards=1,
                                 shard_id=0, seed=seed)
    test = TestSet(ctx)
    values = {**test.metrics(test.logits(state)), "weight_distance": state_distance(state, ctx.new_model()
                                                                                     .trainable_state()),
              "train_time_s": record["train_time_s"]}
    write_metrics(study_rows(ctx, values, model="ablation", shards=1, seed=seed,
                             variant=json.loads(point_variant(label, point)), num_samples=len(test.ids),
                             wall_time_s=record["train_time_s"]), args.output.metrics)
    print(f"{ctx.method} ablation {label}: accuracy {values['accuracy']:.4f}, ‖Δw‖ {values['weight_distance']:.4g}")
