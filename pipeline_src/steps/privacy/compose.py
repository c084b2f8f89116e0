"""compose_private: the Δw sum of the DP shard models of a taft method (one regime, one ε).

Tangent models sharing one linearization point are linear in Δw, so the weighted Δw sum is
exactly the ensemble of the shards (uniform weights: shard sizes are private) (Liu & Soatto et al. 2024, "Tangent Transformers
for Composition, Privacy and Removal", §3.2-3.4). Each shard is (ε, δ)-DP on its own
disjoint shard, so by parallel composition the sum is (max ε, max δ)-DP on the whole
training split (McSherry 2009, "Privacy integrated queries", parallel composition).
"""
from __future__ import annotations

from pipeline_src.methods.composition import composition_weights
from pipeline_src.methods.kinds import kind_of
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.model_io import load_model, save_model
from pipeline_src.taft.compose import check_same_linearization, compose_deltas

_SAME = ("method", "regime", "method_config", "dp_settings", "backbone_digest", "head_seed", "num_classes")


def composed_privacy(records: list[dict]) -> dict:
    """Guarantee of a composition of models trained on disjoint shards: the worst component's."""
    parts = [r["privacy"] for r in records]
    return {
        "composition": "parallel (disjoint shards)",
        "epsilon": max(p["epsilon"] for p in parts), "epsilon_spent": max(p["epsilon_spent"] for p in parts),
        "delta": max(p["delta"] for p in parts), "accountant": parts[0]["accountant"],
        "neighbouring": parts[0].get("neighbouring"),
        "components": parts,
    }


def main(args: StepArgs) -> None:
    loaded = [load_model(p) for p in args.input.models]
    states, records = [list(x) for x in zip(*loaded)]
    first = records[0]
    if not kind_of(first["method_config"]).tangent:
        raise ValueError(f"compose_private: Δw composition needs taft shard models, got kind "
                         f"'{first['method_config']['kind']}' (other kinds are ensembled at evaluation)")
    for key in _SAME:
        values = {repr(r[key]) for r in records}
        if len(values) != 1:
            raise ValueError(f"compose_private: shard models differ in '{key}'; refusing to compose")
    if sorted(r["shard_id"] for r in records) != list(range(first["shards"])):
        raise ValueError(f"compose_private: expected shards 0..{first['shards'] - 1}, got "
                         f"{sorted(r['shard_id'] for r in records)}")
    check_same_linearization([r["linearization_id"] for r in records])
    weights = composition_weights(records, "uniform")  # never by size: that would release the private shard sizes
    record = {
        "kind": "composed-private", "composition": "soup", **{k: first[k] for k in _SAME},
        "experiment": first["experiment"], "shards": first["shards"], "seed": first["seed"],
        "linearization_id": first["linearization_id"], "weights": weights,
        "privacy": composed_privacy(records),
        "components": [{"path": p, "shard_id": r["shard_id"]} for p, r in zip(args.input.models, records)],
    }  # no sample ids: the components' membership refs lead the audit to the private store
    save_model(compose_deltas(states, weights), record, args.output.model)
    print(f"composed {len(states)} DP {first['method']} ({first['regime']}) shard models with weights {weights}; "
          f"ε {record['privacy']['epsilon_spent']:.4f}")
