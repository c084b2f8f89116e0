"""Deterministic sharding by a keyed hash of each sample id (SISA-style disjoint shards).

Sample `i` goes to shard ⌊u·N⌋, where u ∈ [0, 1) is a keyed 64-bit BLAKE2b hash of its id
(key: the sharding seed). A sample's shard depends on its own id alone, so adding or removing
one record changes exactly one shard and leaves every other sample where it was: the
add/remove neighbouring relation under which DP-SGD's accountant states ε holds per shard, and
new data retrains only the shards it falls into. Sizes are balanced in expectation
(binomial, not equal); a shard count that leaves a shard empty is refused. The same ids, N and
seed give the same manifest, byte for byte. Torch-free: the Snakefile uses it at parse time.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import pyarrow as pa

from pipeline_src.plan.arrow_tables import table_from_columns

MANIFEST_SCHEMA = pa.schema([
    ("sample_id", pa.string()),
    ("shard", pa.int64()),
])
def keyed_unit(sample_id: str, key: str) -> float:
    """A uniform number in [0, 1) from a keyed hash of `sample_id` (53 bits, exact in float64)."""
    digest = hashlib.blake2b(sample_id.encode(), key=key.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


def keyed_units(sample_ids: Sequence[str], key: str) -> np.ndarray:
    """`keyed_unit` of every id, as a float64 array: the same values, at half the cost (the keyed
    hasher is set up once and copied per id; the Fashion study hashes ~140,000 ids per dry run).
    Equal to `keyed_unit` bit for bit: both take the top 53 bits of the same digest, an integer
    below 2**53 that float64 holds exactly, and divide by 2**53 (exact: a power of two).

    Args:
        sample_ids: the ids.
        key: the hash key, e.g. 'split/<seed>'.
    """
    keyed = hashlib.blake2b(key=key.encode(), digest_size=8)

    def digest(sample_id: str) -> bytes:
        h = keyed.copy()
        h.update(sample_id.encode())
        return h.digest()

    top = np.frombuffer(b"".join(map(digest, sample_ids)), dtype=">u8") >> np.uint64(11)  # (n,) 53-bit integers
    return top.astype(np.float64) / float(1 << 53)


def shard_of(sample_id: str, num_shards: int, seed: int) -> int:
    """The shard of one sample: ⌊u·N⌋ with u = keyed_unit(id, 'shard/<seed>')."""
    return int(keyed_unit(sample_id, f"shard/{seed}") * num_shards)


def shard_manifest(train_ids: list[str], num_shards: int, seed: int) -> pa.Table:
    """Assign each training sample to one of `num_shards` shards.

    Args:
        train_ids: ids of the training samples (any order; duplicates are an error).
        num_shards: N ≥ 1; every shard must receive at least one sample.
        seed: the hash key (sharding seed).
    Raises:
        ValueError: on duplicates, N > n, or a shard left empty (naming it).
    """
    ids = sorted(train_ids)
    if len(set(ids)) != len(ids):
        dup = next(a for a, b in zip(ids, ids[1:]) if a == b)
        raise ValueError(f"duplicate sample id in training split: {dup}")
    if not 1 <= num_shards <= len(ids):
        raise ValueError(f"shards: {num_shards} shards for {len(ids)} training samples")
    shard = (keyed_units(ids, f"shard/{seed}") * num_shards).astype(np.int64)  # shard_of, all ids at once
    sizes = np.bincount(shard, minlength=num_shards)
    if (sizes == 0).any():
        raise ValueError(f"shards: {num_shards} shards (seed {seed}) leave shard {int(np.argmin(sizes))} empty: "
                         f"{len(ids)} training samples are too few for this shard count")
    return table_from_columns({"sample_id": ids, "shard": shard}, MANIFEST_SCHEMA)  # no pandas (arrow_tables.py)


def shard_sizes(manifest: pa.Table, num_shards: int) -> list[int]:
    """Samples per shard, shards 0..N-1."""
    shards = np.asarray(manifest.column("shard").to_pylist(), dtype=np.int64)  # not to_numpy: it imports pandas
    return np.bincount(shards, minlength=num_shards).tolist()


def shard_ids(manifest: pa.Table, shard: int) -> list[str]:
    """Sorted sample ids of one shard."""
    ids = manifest.column("sample_id").to_pylist()
    shards = manifest.column("shard").to_pylist()
    return [i for i, s in zip(ids, shards) if s == shard]


def membership_digest(ids: list[str]) -> str:
    """SHA-256 of the sorted ids: a parse-time fingerprint of an id list, a rerun trigger (a
    params value, a signature file's field) of a non-DP study only. A plain digest lets a reader
    test a guessed member list, so a DP study keys its triggers (`plan/provenance_key.ids_digest`)
    and its models' refs (`store/private_provenance`)."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()
