"""split: the shard manifest (sample_id → shard) of the target task's training split."""
from __future__ import annotations

from pipeline_src.data.sample_store import SampleStore
from pipeline_src.plan.sharding import shard_manifest
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_parquet


def main(args: StepArgs) -> None:
    store = SampleStore(args.input.samples)
    shards, seed = int(args.wildcards["shards"]), int(args.wildcards["seed"])
    manifest = shard_manifest(store.ids("target", "train"), shards, seed)
    write_parquet(manifest, args.output.manifest)
    print(f"{manifest.num_rows} training samples into {shards} shards (seed {seed})")
