"""Keyed-hash splits and shards in the DAG: new samples rerun `prepare` and retrain only the
shards they fall into, and removing one sample changes exactly one shard (a real Snakemake run on
an ImageFolder). Also as a DP study, whose rerun triggers built from id lists are keyed (issue 43):
they still change exactly when a list does."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline_src.plan.config import validate_config
from pipeline_src.plan.samples import assign_splits, list_samples
from pipeline_src.plan.sharding import shard_of
from tests.conftest import snakemake

pytestmark = pytest.mark.e2e
N = 4
TARGETS = [f"results/newdata/train/fc/n{N}_s0/shard{i}.safetensors" for i in range(N)]


def run(workdir: Path, *args: str) -> str:
    """A real Snakemake run (or dry run) on 2 cores; its output."""
    proc = snakemake(workdir, "--cores", "2", *args)
    return proc.stdout + proc.stderr


def planned(workdir: Path, rule: str) -> set[str]:
    """The outputs of `rule`'s jobs in a dry run."""
    out = run(workdir, "-n", *TARGETS)
    jobs = re.findall(rf"^rule {rule}:\n(?:    .*\n)*?    output: ([^\n]+)", out, flags=re.M)
    return {o.split(",")[0].strip() for o in jobs}


def write_images(root: Path, cls: str, names: list[str], seed: int) -> None:
    from PIL import Image

    (root / cls).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(root / cls / name)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "dp"])
def study(request, tmp_path_factory) -> tuple[Path, dict]:
    workdir = tmp_path_factory.mktemp("newdata")
    root = workdir / "data"
    for k, cls in enumerate("01234"):
        write_images(root, cls, [f"img{i:02d}.png" for i in range(30)], seed=k)
    cfg = {"experiment": "newdata", "dataset": {"source": "imagefolder", "path": str(root), "img_size": 8,
                                                 "in_chans": 1, "source_classes": [0, 1]},
           "backbone": {"source": "pretrain", "arch": {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2},
                        "pretrain": {"epochs": 1, "batch_size": 64}},
           "train": {"epochs": 1, "batch_size": 64}, "shards": [N],
           # per-shard jobs: new data reruns a vectorized job (all N shards) whole (README "Training shards together")
           "methods": {"fc": {"kind": "fc", "vectorized_shards": False}}}
    if request.param:  # a DP study (its DP jobs are not targeted): keyed triggers, same reruns
        cfg["methods"]["taft-1"] = {"kind": "taft", "k": 1}
        cfg["privacy"] = {"enabled": True, "public_train_size": 60, "methods": ["taft-1"], "regimes": ["fc"],
                          "epsilons": [8], "shards": [1], "batch_size": 16, "paper": {"methods": []}}
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    run(workdir, *TARGETS)
    assert (workdir / "results/newdata/provenance/key").is_file() == request.param
    return workdir, cfg


def test_new_samples_retrain_only_the_shards_they_hash_to(study):
    workdir, cfg = study
    names = [f"new{k}.png" for k in range(5)]
    write_images(workdir / "data", "2", names, seed=99)
    ds = validate_config(cfg, count_samples=False)["dataset"]
    table = assign_splits(list_samples(ds), ds, 0).to_pydict()
    split = dict(zip(table["sample_id"], table["split"]))
    new_ids = [f"data/2/{n}" for n in names]
    expected = {TARGETS[shard_of(i, N, 0)] for i in new_ids if split[i] == "train"}
    assert expected and len(expected) < N, "the hash must put the new samples in some, not all, shards"
    assert planned(workdir, "prepare") == {"results/newdata/prepare/samples.parquet"}  # its listing changed
    assert planned(workdir, "train") == expected
    assert planned(workdir, "pretrain") == set()  # target-task data does not retrain the backbone
    run(workdir, *TARGETS)


def test_removing_one_sample_changes_one_shard(study):
    workdir, cfg = study
    ds = validate_config(cfg, count_samples=False)["dataset"]
    table = assign_splits(list_samples(ds), ds, 0).to_pydict()
    victim = next(i for i, s, c in zip(table["sample_id"], table["split"], table["class_name"])
                  if s == "train" and c == "3")
    (workdir / victim).unlink()
    assert planned(workdir, "forget_manifest") == {f"results/newdata/split/n{N}_s0/shard{shard_of(victim, N, 0)}.parquet"}
    assert planned(workdir, "train") == {TARGETS[shard_of(victim, N, 0)]}
