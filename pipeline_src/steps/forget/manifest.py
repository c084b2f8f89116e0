"""forget_manifest: one shard's training ids, minus the forgotten ones (see workflow/rules/forget.smk).

The forgotten ids of this shard arrive as the job's params (computed at DAG-build time). They
are checked here against the request file and the prepared samples table, so a DAG-build-time
assignment that disagreed with the real manifest would fail loudly instead of keeping an id.
"""
from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline_src.plan.forget import forgotten_by_shard, read_request, remove_ids, validate_request
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_parquet


def main(args: StepArgs) -> None:
    shard = int(args.wildcards["shard"])
    manifest = pq.read_table(args.input.manifest)
    path = args.config["forget"]["requests"]
    requested = validate_request(read_request(path), pq.read_table(args.input.samples)) if path else []
    expected = forgotten_by_shard(manifest, requested).get(shard, [])
    forgotten = sorted(args.params["forgotten"])
    if forgotten != expected:
        raise RuntimeError(f"forget_manifest: shard {shard} params list {len(forgotten)} forgotten ids but the "
                           f"request and manifest give {len(expected)}; the DAG-build-time split disagrees")
    rows = manifest.filter(pc.equal(manifest.column("shard"), shard))
    kept = remove_ids(rows, forgotten)
    if kept.num_rows == 0:
        raise RuntimeError(f"forget_manifest: the request removes every sample of shard {shard}")
    write_parquet(kept, args.output.manifest)
    print(f"shard {shard}: {kept.num_rows} of {rows.num_rows} samples kept, {len(forgotten)} forgotten")
