import pyarrow.parquet as pq
import pytest

from pipeline_src.plan.sharding import shard_ids, shard_manifest
from pipeline_src.store.atomic import write_parquet

IDS = [f"s{i:03d}" for i in range(103)]


def test_manifest_is_a_partition_with_balanced_shards():
    m = shard_manifest(IDS, 4, seed=1)
    shards = [shard_ids(m, s) for s in range(4)]
    assert sorted(i for s in shards for i in s) == sorted(IDS)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_same_inputs_give_the_same_bytes(tmp_path):
    write_parquet(shard_manifest(IDS, 5, seed=3), tmp_path / "a.parquet")
    write_parquet(shard_manifest(list(reversed(IDS)), 5, seed=3), tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert pq.read_table(tmp_path / "a.parquet").num_rows == len(IDS)


def test_seed_changes_the_assignment():
    a, b = shard_manifest(IDS, 4, seed=0), shard_manifest(IDS, 4, seed=1)
    assert a.column("shard").to_pylist() != b.column("shard").to_pylist()


def test_more_shards_than_samples_and_duplicates_fail():
    with pytest.raises(ValueError, match="5 shards for 3"):
        shard_manifest(IDS[:3], 5, seed=0)
    with pytest.raises(ValueError, match="duplicate sample id in training split: s001"):
        shard_manifest(["s001", "s001", "s002"], 2, seed=0)
