"""forget_manifest: one shard's training manifest, its ids minus the forgotten ones
(see workflow/rules/forget.smk).

The ids arrive as the job's params, computed at DAG-build time from the config alone (the
dataset listing, keyed-hash split and sharding, the validated forget request), so the job has
no input files: it reruns exactly when its own members change.
"""
from __future__ import annotations

import pyarrow as pa

from pipeline_src.plan.sharding import MANIFEST_SCHEMA
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_parquet


def main(args: StepArgs) -> None:
    shard = int(args.wildcards["shard"])
    members, forgotten = list(args.params["members"]), list(args.params["forgotten"])
    if not members:
        raise RuntimeError(f"forget_manifest: shard {shard} has no sample left to train on")
    table = pa.Table.from_pydict({"sample_id": members, "shard": [shard] * len(members)}, schema=MANIFEST_SCHEMA)
    # a DP study's manifests name its members: owner-only, like the provenance store
    write_parquet(table, args.output.manifest, mode=0o600 if args.runtime["private_workspace"] else None)
    print(f"shard {shard}: {len(members)} samples, {len(forgotten)} forgotten")
