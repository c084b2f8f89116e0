"""Deterministic sharding: uniform sampling without replacement (SISA-style disjoint shards).

The training sample ids are sorted, permuted with `numpy.random.default_rng(seed)` and dealt
into N contiguous, near-equal shards. The same ids, N and seed give the same manifest, byte
for byte.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

MANIFEST_SCHEMA = pa.schema([
    ("sample_id", pa.string()),
    ("shard", pa.int64()),
])


def shard_manifest(train_ids: list[str], num_shards: int, seed: int) -> pa.Table:
    """Assign each training sample to one of `num_shards` shards.

    Args:
        train_ids: ids of the training samples (any order; duplicates are an error).
        num_shards: N ≥ 1; at most the number of samples.
        seed: permutation seed.
    """
    ids = sorted(train_ids)
    if len(set(ids)) != len(ids):
        dup = next(a for a, b in zip(ids, ids[1:]) if a == b)
        raise ValueError(f"duplicate sample id in training split: {dup}")
    if not 1 <= num_shards <= len(ids):
        raise ValueError(f"shards: {num_shards} shards for {len(ids)} training samples")
    perm = np.random.default_rng(seed).permutation(len(ids))
    # Position p in the permutation goes to shard floor(p * N / n): sizes differ by at most 1.
    shard_of_pos = (np.arange(len(ids)) * num_shards) // len(ids)
    shard = np.empty(len(ids), dtype=np.int64)
    shard[perm] = shard_of_pos
    return pa.Table.from_pydict({"sample_id": ids, "shard": shard}, schema=MANIFEST_SCHEMA)


def shard_ids(manifest: pa.Table, shard: int) -> list[str]:
    """Sorted sample ids of one shard."""
    ids = manifest.column("sample_id").to_pylist()
    shards = manifest.column("shard").to_pylist()
    return [i for i, s in zip(ids, shards) if s == shard]
