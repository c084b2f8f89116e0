"""compose: the model soup of a method's shard models (ensembles are formed at evaluation)."""
from __future__ import annotations

from pipeline_src.composition import average_states
from pipeline_src.model_io import load_model, save_model
from pipeline_src.step_args import StepArgs


def main(args: StepArgs) -> None:
    loaded = [load_model(p) for p in args.input.models]
    states, records = zip(*loaded)
    digests = {r["backbone_digest"] for r in records}
    if len(digests) != 1:
        raise ValueError("compose: shard models were trained from different backbones; refusing to average")
    first = records[0]
    record = {
        "kind": "composed", "composition": "soup", "method": first["method"], "method_config": first["method_config"],
        "experiment": first["experiment"], "shards": first["shards"], "seed": first["seed"],
        "head_seed": first["head_seed"], "num_classes": first["num_classes"], "backbone_digest": digests.pop(),
        "components": [{"path": p, "shard_id": r["shard_id"], "num_samples": r["num_samples"]}
                       for p, r in zip(args.input.models, records)],
        "sample_ids": sorted(i for r in records for i in r["sample_ids"]),
    }
    save_model(average_states(list(states)), record, args.output.model)
    print(f"soup of {len(states)} {first['method']} shard models")
