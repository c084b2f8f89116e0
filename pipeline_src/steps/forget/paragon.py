"""unlearn_paragon and unlearn_paragon_nonlinear: the paragons of unlearning, a model retrained
from scratch on the whole training set minus the forgotten ids (Bourtoule et al., "Machine
Unlearning", IEEE S&P 2021: the cost SISA avoids).

- `unlearn_paragon` retrains the same method (e.g. TAFT on TAFT);
- `unlearn_paragon_nonlinear` retrains the non-linear model a linearized method stands for
  (taft-k → nlft-k, `plan.forget.nonlinear_paragon`): the paragon of Liu, Soatto et al.,
  "Tangent Transformers for Composition, Privacy and Removal", ICLR 2024, App. C.3 and Fig. 3
  ("re-training the non-linear model from scratch"). Rows: model `paragon-nonlinear`.

The request is drawn exactly as `unlearn_retrain` draws it (same ids, fraction, seed and request
number), from the sample ids of the DAG's full-data model of the studied method
(`train/{method}/n1_s{seed}/shard0`).
"""
from __future__ import annotations

import dataclasses

from pipeline_src.plan.forget import nonlinear_paragon, random_request
from pipeline_src.runner.runtime import set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.forget.common import StudyContext, TestSet, load_context, study_images, study_rows, train_on_ids
from pipeline_src.store.metrics import write_metrics
from pipeline_src.store.model_io import load_model, save_model
from pipeline_src.store.per_image import per_image_output, write_per_image


def paragon_context(ctx: StudyContext) -> tuple[StudyContext, str]:
    """The context that trains the non-linear paragon of `ctx.method`, and that method's name.

    Raises:
        ValueError: the method is not linearized (its own retraining is the paragon).
    """
    found = nonlinear_paragon(ctx.cfg, ctx.method)
    if found is None:
        raise ValueError(f"unlearn_paragon_nonlinear: method '{ctx.method}' is not linearized; its own retraining "
                         f"(unlearn_paragon) is the non-linear paragon")
    name, method_cfg = found
    cfg = {**ctx.cfg, "methods": {**ctx.cfg["methods"], name: method_cfg}}
    return dataclasses.replace(ctx, cfg=cfg, method=name), name


def main(args: StepArgs) -> None:
    w = args.wildcards
    seed, fraction, request = int(w["seed"]), float(w["fraction"]), int(w["request"])
    set_up_job(args.threads, seed)
    ctx = load_context(args)
    nonlinear = bool(args.params.get("nonlinear"))  # rule unlearn_paragon_nonlinear
    studied = ctx.method
    trainer, model_name = (paragon_context(ctx)[0], "paragon-nonlinear") if nonlinear else (ctx, "paragon")
    _, full = load_model(args.input.full)
    forgotten = random_request(full["sample_ids"], fraction, seed, request)
    drop = set(forgotten)
    kept = [i for i in full["sample_ids"] if i not in drop]
    state, record = train_on_ids(trainer, kept, seed * 1000, f"{studied} {model_name} ({trainer.method}) "
                                 f"f={fraction} q={request}", shards=1, shard_id=0, seed=seed, strategy=model_name,
                                 forgotten_ids=forgotten, paragon_of=studied)
    save_model(state, record, args.output.model)
    test = TestSet(trainer)
    logits = test.logits(state)
    values = {**test.metrics(logits), "unlearn_time_s": record["train_time_s"],
              "train_time_s": record["train_time_s"], "forgotten": len(forgotten), "retrained_samples": len(kept)}
    variant = {"strategy": model_name, "fraction": fraction, "request": request, "trained_method": trainer.method}
    # rows under the studied method, so the report joins them with its retrain-shard rows
    write_per_image(study_images(ctx, test, logits, model=model_name, shards=1, seed=seed, variant=variant),
                    per_image_output(args.output))
    write_metrics(study_rows(ctx, values, model=model_name, shards=1, seed=seed,
                             variant=variant, num_samples=len(test.ids), wall_time_s=record["train_time_s"]),
                  args.output.metrics)
    print(f"{studied} {model_name} ({trainer.method}) f={fraction} q={request}: {len(kept)} samples, accuracy "
          f"{values['accuracy']:.4f}, train {record['train_time_s']:.2f}s")
