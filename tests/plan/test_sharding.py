import pyarrow.parquet as pq
import pytest

from pipeline_src.plan.sharding import keyed_unit, keyed_units, shard_ids, shard_manifest, shard_of, shard_sizes
from pipeline_src.store.atomic import write_parquet

IDS = [f"s{i:03d}" for i in range(103)]


def test_manifest_is_a_partition_with_shards_balanced_in_expectation():
    m = shard_manifest(IDS, 4, seed=1)
    shards = [shard_ids(m, s) for s in range(4)]
    assert sorted(i for s in shards for i in s) == sorted(IDS)
    many = shard_manifest([f"x{i}" for i in range(20000)], 10, seed=0)
    sizes = shard_sizes(many, 10)  # binomial(20000, 0.1): sd ≈ 42
    assert sum(sizes) == 20000 and max(abs(s - 2000) for s in sizes) < 200


def test_one_record_added_or_removed_changes_exactly_one_shard():
    base = shard_manifest(IDS, 5, seed=2)
    for ids, changed in ((IDS[1:], IDS[0]), (IDS + ["new-sample"], "new-sample")):
        other = shard_manifest(ids, 5, seed=2)
        shard = shard_of(changed, 5, 2)
        for s in range(5):
            same = shard_ids(base, s) == shard_ids(other, s)
            assert same == (s != shard), (changed, s)


def test_an_empty_shard_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"leave shard \d+ empty"):
        shard_manifest(IDS[:6], 6, seed=0)


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


def test_keyed_units_equal_keyed_unit_bit_for_bit():
    # Both divide the same 53-bit integer by 2**53, each step exact in float64: equality is guaranteed.
    ids = [f"s{i}" for i in range(500)] + ["é/ü", "", "digits/3/0001"]
    for key in ("split/0", "limit/7", "shard/3"):
        assert keyed_units(ids, key).tolist() == [keyed_unit(i, key) for i in ids]
    assert keyed_units([], "split/0").shape == (0,)


def test_the_manifest_assigns_each_id_its_shard_of():
    ids = [f"s{i}" for i in range(300)]
    table = shard_manifest(ids, 7, seed=2)
    assert table.column("shard").to_pylist() == [shard_of(i, 7, 2) for i in table.column("sample_id").to_pylist()]
