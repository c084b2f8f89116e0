"""fusion_match: match a method's N shard models to shard 0 (the anchor), one matching kind.

Zhang et al., "Beyond the Permutation Symmetry of Transformers: The Role of Rotation for
Model Fusion", ICML 2025 (their Figure 3 plots the distance to the anchor after each kind of
matching). Writes the N matched models (`<out dir>/shard{i}.safetensors`, shard 0 unchanged) and one
metrics file with
  * per shard i > 0 (split 'params'): `anchor_distance` ‖θ_i − θ_0‖₂ over every trained tensor,
    `anchor_distance_matchable` over the tensors matching may change, `match_time_s`;
  * per shard (split 'test', model 'fusion-shard'): accuracy and loss of the matched model, and
    `logits_max_change`, max |Δlogit| / max |logit| against the unmatched model (matching keeps
    the function, so this is rounding only).
"""
from __future__ import annotations

import time
from pathlib import Path

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.matching import parameter_distance
from pipeline_src.methods.evaluation import classification_metrics
from pipeline_src.methods.fusion_models import (
    chosen_blocks,
    load_features,
    logits_of_states,
    match_state,
    matchable_keys,
    num_heads_of,
    prefix_rows,
)
from pipeline_src.methods.kinds import matches_ffn
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.plan.fusion import variant
from pipeline_src.runner.runtime import resolve_device, set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.metrics import metric_rows, write_metrics
from pipeline_src.store.model_io import load_model, save_model


def main(args: StepArgs) -> None:
    cfg, w = args.settings, args.wildcards
    matching, init, seed = w["matching"], w["init"], int(w["seed"])
    set_up_job(args.threads, seed)
    device = resolve_device(args.runtime["device"])
    fus = cfg["fusion"]
    states, records = [list(x) for x in zip(*(load_model(p) for p in args.input.models))]
    first = records[0]
    kind = first["method_config"]["kind"]
    backbone, backbone_record = load_backbone(Path(args.input.backbone).parent)
    template = build_tuned_model(backbone, first["method_config"], first["num_classes"], first["head_seed"]).to(device)
    heads = num_heads_of(template, first["method_config"])
    anchor = states[0]
    blocks = chosen_blocks(anchor, kind, fus["blocks"])
    ffn = fus["match_ffn"] and matches_ffn(kind)

    store = SampleStore(args.input.samples)
    test = store.split("target", "test")
    context = dict(experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method=w["method"], kind=kind,
                   model="fusion-shard", variant=variant(cfg, init, matching), shards=int(w["shards"]), seed=seed)
    all_keys = [k for k, v in anchor.items() if v.is_floating_point()]
    match_keys = matchable_keys(anchor, kind, blocks, fus["match_ffn"])
    matched, seconds = [], []
    for i, state in enumerate(states):
        t0 = time.perf_counter()
        matched.append(dict(state) if i == 0 else match_state(anchor, state, matching=matching, kind=kind,
                                                             num_heads=heads, blocks=blocks, ffn=ffn, model=template,
                                                             head_permutation=fus.get("head_permutation", False)))
        seconds.append(time.perf_counter() - t0)
    # One pass over the test split, a batch at a time, for every model before and after matching.
    eval_batch = args.runtime["eval_batch_size"]
    h = prefix_rows(template, store, test.ids, load_features(args.input._names.get("features")), backbone_record,
                    device, eval_batch)
    logits = logits_of_states(template, [*states, *matched], h, eval_batch)
    rows = []
    out_dir = Path(args.output.models)
    for i, record in enumerate(records):
        before, after = logits[i], logits[len(states) + i]
        values = {**classification_metrics(after, test.labels),
                  "logits_max_change": float((after - before).abs().max() / before.abs().max())}
        rows += metric_rows(values, context={**context, "shard_id": i, "split": "test", "num_samples": len(test.ids)},
                            device=device, wall_time_s=seconds[i])
        if i > 0:
            dist = {"anchor_distance": parameter_distance(anchor, matched[i], all_keys),
                    "anchor_distance_matchable": parameter_distance(anchor, matched[i], match_keys),
                    "match_time_s": seconds[i]}
            rows += metric_rows(dist, context={**context, "shard_id": i, "split": "params",
                                               "num_samples": record["num_samples"]}, device=device,
                                wall_time_s=seconds[i])
        save_model(matched[i], {**record, "kind": "matched", "matching": matching, "init": init,
                                "matched_blocks": blocks, "match_ffn": ffn, "anchor": args.input.models[0],
                                "source": args.input.models[i]}, out_dir / f"shard{i}.safetensors")
        print(f"{w['method']} {init} n{w['shards']} shard {i}: {matching} in {seconds[i]:.3f} s, "
              + ", ".join(f"{k} {v:.4g}" for k, v in values.items()))
    write_metrics(rows, args.output.metrics)
