"""signature: write one parse-time signature (canonical JSON of settings) to a file.

Shard jobs read the shared upstream files (samples, backbone, features) as `ancient` inputs, so
new data reruns only the shards it falls into. Snakemake then skips its own params check of a
job below one that reruns; a signature file, written by a job with no inputs whose params are
the signature, carries those settings along a normal input edge instead, so a changed setting
still reruns its jobs in the same invocation as a data change.
"""
from __future__ import annotations

import json

from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_json


def main(args: StepArgs) -> None:
    write_json(json.loads(args.params["value"]), args.output.signature)
    print(f"signature {args.wildcards['name']} written")
