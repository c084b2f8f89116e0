"""Vectorized first training of fc, nlft, last and taft shards through Snakemake, then a forget request:
only the touched shard retrains, in a per-shard `train` job; the vectorized job does not rerun."""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file

from pipeline_src.plan.sharding import shard_ids
from pipeline_src.store.model_io import load_model
from tests.conftest import REPO, planned_outputs, snakemake

pytestmark = pytest.mark.e2e
VECTORIZED = ("fc", "nlft-1", "last", "taft-1")
TARGETS = [f"results/tiny/train/{m}/n3_s0/shard{i}.safetensors" for m in (*VECTORIZED, "nlft-1-alone") for i in range(3)]


def _config(requests: str | None = None) -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["device"] = "cpu"
    cfg["methods"] = {"fc": {"kind": "fc", "vectorized_shards": True},
                      "nlft-1": {"kind": "nlft", "k": 1, "vectorized_shards": "auto"},  # shards of ~90 < 400
                      "nlft-1-alone": {"kind": "nlft", "k": 1},
                      "last": {"kind": "last", "rank": 8, "heads": 2, "vectorized_shards": True},
                      "taft-1": {"kind": "taft", "k": 1}}  # auto
    cfg["shards"], cfg["fusion"], cfg["last_grid"] = [3], {"enabled": False}, {"enabled": False}
    cfg["forget"] = {"requests": requests, "study": {"enabled": False}}
    return cfg


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("vectorized")  # its own: the training targets need a few jobs only
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config()))
    snakemake(workdir, *TARGETS, "--cores", "2")
    return workdir


def test_first_training_is_one_job_per_method_and_equals_per_shard_jobs(study):
    for m in VECTORIZED:
        logs = sorted(p.name for p in (study / f"results/tiny/logs/train/{m}/n3_s0").glob("*.bench.tsv"))
        assert logs == ["vectorized.bench.tsv"], (m, logs)
        for i in range(3):
            assert load_model(study / f"results/tiny/train/{m}/n3_s0/shard{i}.safetensors")[1]["vectorized_over_shards"] == 3
    # the same method trained in per-shard jobs: the same tensors up to float32 rounding
    for i in range(3):
        vec, alone = (load_file(study / f"results/tiny/train/{m}/n3_s0/shard{i}.safetensors") for m in ("nlft-1", "nlft-1-alone"))
        assert vec.keys() == alone.keys()
        for k in vec:
            a, b = vec[k], alone[k]
            if k.endswith("attn.qkv.bias"):
                # The key bias adds q·b_k to every score of a query row, which softmax ignores:
                # its true gradient is 0, so Adam steps on float rounding noise. Compare q and v.
                d = a.numel() // 3
                a, b = torch.cat([a[:d], a[2 * d:]]), torch.cat([b[:d], b[2 * d:]])
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (i, k)


def test_a_forget_request_retrains_only_the_touched_shard_in_its_own_job(study):
    ids = shard_ids(pq.read_table(study / "results/tiny/split/n3_s0/shard1.parquet"), 1)[:2]
    (study / "forget.txt").write_text("\n".join(ids) + "\n")
    (study / "forget.yaml").write_text(yaml.safe_dump(_config(str(study / "forget.txt"))))
    args = (*TARGETS, "--cores", "2", "--configfile", str(study / "forget.yaml"))
    proc = snakemake(study, *args, "-n")
    outputs = " ".join(planned_outputs(proc))
    rules = set(re.findall(r"^rule (\S+):", proc.stdout + proc.stderr, flags=re.M))
    # The search's grid points retrain their touched shard, and are composed, validated and selected
    # again (`select` is a checkpoint). The searched methods' vectorized jobs wait on it in a dry run,
    # which cannot know the choice; they run only if it changes (below, the real run: it does not).
    searched = set(_config()["search"]["methods"])
    waiting = {f"train_vectorized_{m}_n3_s0" for m in searched}
    assert rules - waiting == {"forget_manifest", "train", "compose", "validate"}, rules
    for m in (*VECTORIZED, "nlft-1-alone"):
        assert f"results/tiny/train/{m}/n3_s0/shard1.safetensors" in outputs
    assert not re.search(r"(?<!fc)(?<!taft-1)/n3_s0/shard[02]\.", outputs), outputs
    untouched = {p: p.stat().st_mtime for m in VECTORIZED for p in (study / f"results/tiny/train/{m}/n3_s0").glob("shard[02].*")}
    untouched |= {p: p.stat().st_mtime for m in VECTORIZED for p in [study / f"results/tiny/logs/train/{m}/n3_s0/vectorized.bench.tsv"]}
    proc = snakemake(study, *args)
    assert {p: p.stat().st_mtime for p in untouched} == untouched
    assert "Updating checkpoint dependencies" in proc.stdout + proc.stderr  # `select` did run again
    for m in VECTORIZED:
        record = load_model(study / f"results/tiny/train/{m}/n3_s0/shard1.safetensors")[1]
        assert "vectorized_over_shards" not in record and not set(ids) & set(record["sample_ids"])
        assert (study / f"results/tiny/logs/train/{m}/n3_s0/shard1.bench.tsv").exists()
    assert "Nothing to be done" in snakemake(study, *args, "-n").stdout
