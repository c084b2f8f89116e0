"""compose: one model from a method's shard models (ensembles are formed at evaluation).

For non-linear methods this is the model soup. For `taft` it is the weighted sum of the shard
Δw, which equals the weighted ensemble of the shard tangent models exactly (the model is linear
in Δw); the components must share one linearization point, and are refused otherwise.
"""
from __future__ import annotations

from pipeline_src.fusion.soup import weighted_average
from pipeline_src.methods.composition import composition_weights
from pipeline_src.methods.kinds import kind_of
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.model_io import load_model, save_model
from pipeline_src.taft.compose import check_same_linearization, compose_deltas


def main(args: StepArgs) -> None:
    loaded = [load_model(p) for p in args.input.models]
    states, records = [list(x) for x in zip(*loaded)]
    digests = {r["backbone_digest"] for r in records}
    if len(digests) != 1:
        raise ValueError("compose: shard models were trained from different backbones; refusing to average")
    first = records[0]
    weights = composition_weights(records, args.settings["compose_weights"])
    if kind_of(first["method_config"]).tangent:
        check_same_linearization([r["linearization_id"] for r in records])
        state = compose_deltas(states, weights)
    else:
        state = weighted_average(states, weights)
    record = {
        "kind": "composed", "composition": "soup", "method": first["method"], "method_config": first["method_config"],
        "experiment": first["experiment"], "shards": first["shards"], "seed": first["seed"],
        "head_seed": first["head_seed"], "num_classes": first["num_classes"], "backbone_digest": digests.pop(),
        "linearization_id": first.get("linearization_id"), "weights": weights,
        "components": [{"path": p, "shard_id": r["shard_id"], "num_samples": r["num_samples"]}
                       for p, r in zip(args.input.models, records)],
        "sample_ids": sorted(i for r in records for i in r["sample_ids"]),
    }
    save_model(state, record, args.output.model)
    print(f"composed {len(states)} {first['method']} shard models with weights {weights}")
