"""The pretraining pool (`dataset.pretrain_pool`): disjoint from every target sample, recorded by the
backbone, refused in a forget request."""
from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.forget import ForgetRequestError, validate_request
from pipeline_src.plan.pretrain_pool import check_disjoint
from pipeline_src.plan.samples import assign_splits, list_samples, split_and_limit
from pipeline_src.plan.step_settings import dataset_signature, settings_for
from tests.conftest import REPO, snakemake

POOL = {"fraction": 0.5, "classes": None, "seed": 3, "val_fraction": 0.1, "test_fraction": 0.1}
DIGITS = {"source": "digits", "img_size": 8, "in_chans": 1, "val_fraction": 0.1, "test_fraction": 0.3,
          "source_classes": [0, 1, 2, 3, 4]}


def _hash_unit(sample_id: str, key: str) -> float:
    # the pool's hash written out from its definition (BLAKE2b-64, keyed; top 53 bits), not imported
    h = hashlib.blake2b(sample_id.encode(), key=key.encode(), digest_size=8).digest()
    return (int.from_bytes(h, "big") >> 11) / 2.0 ** 53


def _rows(table: pa.Table, task: str, split: str | None = None) -> set[str]:
    mask = pc.equal(table.column("task"), task)
    if split is not None:
        mask = pc.and_(mask, pc.equal(table.column("split"), split))
    return set(pc.filter(table.column("sample_id"), mask).to_pylist())


def test_the_pool_shares_no_sample_with_the_target_task():
    plain = assign_splits(list_samples(DIGITS), DIGITS, seed=0)  # today's far layout: no pool
    cfg = DIGITS | {"pretrain_pool": POOL}
    table = assign_splits(list_samples(cfg), cfg, seed=0)
    pool, target = _rows(table, "source"), _rows(table, "target")
    assert pool and target and not pool & target
    # the pool is exactly the training images (of every class) whose keyed hash is under the fraction
    train_all = _rows(plain, "source", "train") | _rows(plain, "target", "train")
    assert pool == {i for i in train_all if _hash_unit(i, "pool/3") < 0.5}
    assert len(pool) == pytest.approx(len(train_all) / 2, rel=0.1)
    assert {c for c, t in zip(table.column("class_name").to_pylist(), table.column("task").to_pylist())
            if t == "source"} == {str(d) for d in range(10)}  # every class pretrains
    # target val and test are the same images as without the pool; target train loses the pool's
    for split in ("val", "test"):
        assert _rows(table, "target", split) == _rows(plain, "target", split)
    assert _rows(table, "target", "train") == _rows(plain, "target", "train") - pool
    assert {s for t, s in zip(table.column("task").to_pylist(), table.column("split").to_pylist())
            if t == "source"} == {"train", "val", "test"}  # the backbone's own val and test come from the pool
    check_disjoint(table, POOL)


def test_the_pool_of_chosen_classes_and_limits_stays_disjoint_and_idempotent():
    cfg = DIGITS | {"pretrain_pool": POOL | {"classes": [5, 6]}, "limit_per_class": 6, "source_limit_per_class": 4}
    once = split_and_limit(list_samples(cfg), cfg, seed=0)
    table = assign_splits(once, cfg, seed=0)
    assert table.equals(assign_splits(list_samples(cfg), cfg, seed=0))  # prepare's two calls agree
    names = table.column("class_name").to_pylist()
    tasks = table.column("task").to_pylist()
    assert {c for c, t in zip(names, tasks) if t == "source"} == {"5", "6"}
    assert {c for c, t in zip(names, tasks) if t == "target"} == {"5", "6", "7", "8", "9"}
    source_labels = {c: lab for c, t, lab in zip(names, tasks, table.column("label").to_pylist()) if t == "source"}
    assert source_labels == {"5": 0, "6": 1}
    assert not _rows(table, "source") & _rows(table, "target")
    check_disjoint(table, cfg["pretrain_pool"])


def test_disjointness_check_names_a_pool_image_in_the_target_task():
    cfg = DIGITS | {"pretrain_pool": POOL}
    table = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    leaked = next(i for i, t in zip(table["sample_id"], table["task"]) if t == "source")
    k = next(k for k, (t, s) in enumerate(zip(table["task"], table["split"])) if t == "target" and s == "train")
    table["sample_id"][k] = leaked  # a target training sample that is a pool image
    with pytest.raises(ValueError, match=f"'{leaked}'"):
        check_disjoint(pa.Table.from_pydict(table), POOL)
    table["task"][k] = "source"  # the same id listed twice
    with pytest.raises(ValueError, match=f"sample id '{leaked}' appears twice"):
        check_disjoint(pa.Table.from_pydict(table), POOL)


def _study(**dataset) -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["dataset"] |= {"pretrain_pool": {"fraction": 0.5}, **dataset}
    return cfg


def test_a_forget_request_naming_a_pool_id_is_refused_by_name(tmp_path):
    cfg = validate_config(_study(), count_samples=False)
    table = assign_splits(list_samples(cfg["dataset"]), cfg["dataset"], seed=0)
    pool_id = sorted(_rows(table, "source"))[0]
    target_id = sorted(_rows(table, "target", "train"))[0]
    assert validate_request([target_id], table, cfg["dataset"]["pretrain_pool"]) == [target_id]
    with pytest.raises(ForgetRequestError, match=f"'{pool_id}' is in the backbone's pretraining pool.*new backbone"):
        validate_request([target_id, pool_id], table, cfg["dataset"]["pretrain_pool"])
    request = tmp_path / "forget.txt"
    request.write_text(f"{target_id}\n{pool_id}\n")
    raw = _study()
    raw["forget"]["requests"] = str(request)
    with pytest.raises(ConfigError, match=f"forget.requests.*'{pool_id}'.*pretraining pool"):
        validate_config(raw)


def test_pool_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="dataset.pretrain_pool.fraction"):
        validate_config(_study(pretrain_pool={"fraction": 1.5}), count_samples=False)
    with pytest.raises(ConfigError, match="dataset.pretrain_pool.classes.*'x'"):
        validate_config(_study(pretrain_pool={"fraction": 0.5, "classes": ["x"]}))
    cfg = _study(source_classes=[])  # the pool alone: pretrain on it, fine-tune every class on the rest
    assert validate_config(cfg, count_samples=False)["dataset"]["pretrain_pool"]["seed"] == 0


def test_the_backbone_records_the_pool_it_saw(tmp_path):
    cfg = _study(pretrain_pool={"fraction": 0.4, "seed": 7})
    cfg["backbone"]["pretrain"]["epochs"] = 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    study = f"results/{cfg['experiment']}"
    snakemake(tmp_path, f"{study}/pretrain/backbone.json", "--cores", "1", "--configfile", str(tmp_path / "config.yaml"),
              timeout=600)
    record = json.loads((tmp_path / study / "pretrain/backbone.json").read_text())["pretrain_data"]
    ids = (tmp_path / study / "pretrain/source_ids.txt").read_text().split()
    table = pq.read_table(tmp_path / study / "prepare/samples.parquet")
    assert set(ids) == _rows(table, "source") and all(_hash_unit(i, "pool/7") < 0.4 for i in ids)
    assert record["key"] == "pool/7" and record["count"] == len(ids) == sum(record["count_per_split"].values())
    assert record["definition"]["fraction"] == 0.4 and record["classes"] == [str(d) for d in range(10)]
    # no unkeyed digest of the pool's ids: it would let a reader confirm a guessed pool (issue 43)
    plain = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()
    assert "ids_sha256" not in record and plain not in (tmp_path / study / "pretrain/backbone.json").read_text()
    assert not set(ids) & _rows(table, "target")


def test_a_dp_study_pretrains_on_a_pool_only_when_it_is_declared_public():
    """The release ships the backbone, trained without DP on the pool (docs/privacy.md): refused at
    validation, naming the key, unless the study declares the pool public."""
    raw = _study()
    raw["privacy"] = {"enabled": True, "methods": ["taft-1"], "regimes": ["fc"], "epsilons": [8], "shards": [1],
                      "public_train_size": 500}
    with pytest.raises(ConfigError, match=r"dataset\.pretrain_pool\.public.*WITHOUT differential privacy"):
        validate_config(raw, count_samples=False)
    raw["dataset"]["pretrain_pool"]["public"] = True
    assert validate_config(raw, count_samples=False)["dataset"]["pretrain_pool"]["public"] is True


def test_declaring_the_pool_public_reruns_nothing():
    declared, plain = _study(), _study()
    declared["dataset"]["pretrain_pool"]["public"] = True
    declared, plain = validate_config(declared, count_samples=False), validate_config(plain, count_samples=False)
    assert "public" not in plain["dataset"]["pretrain_pool"]  # absent: not public, and no default to add
    for rule in ("prepare", "pretrain"):
        assert settings_for(rule, declared) == settings_for(rule, plain), rule
    assert dataset_signature(declared) == dataset_signature(plain)
