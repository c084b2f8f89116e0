"""`device: cuda` plans no more jobs than the CPU (issue 41, item 2): `features.cache: auto` keeps
the cache on a GPU when some method's shards train vectorized from it (`plan/vectorized.py`,
`resolve_auto_cache`). Before, auto recomputed the prefix on a GPU, which turned every vectorized
job back into N per-shard jobs: studies/fashion_mnist.yaml planned 2,258 jobs on CUDA against
1,008 on the CPU. The real `snakemake -n` count is tests/e2e/test_gpu_plan.py (a `long` module)."""
from __future__ import annotations

import copy

import pytest
import yaml

from pipeline_src.plan.config import validate_config
from pipeline_src.plan.vectorized import vectorized_jobs
from tests.conftest import REPO
from tests.plan.fashion_like import fashion_mnist_path

STUDIES = sorted((REPO / "studies").glob("*.yaml"))


def _digits(device: str, shards: list[int], **extra) -> dict:
    # digits: 527 target training samples; N = 4 (~132 a shard) vectorizes under auto, N = 1 never
    return validate_config({"experiment": "x", "device": device, "shards": shards, "seeds": [0],
                            "dataset": {"source": "digits", "source_classes": [0, 1, 2, 3, 4]},
                            "methods": {"fc": {"kind": "fc"}, "nlft-1": {"kind": "nlft", "k": 1}}, **extra})


def test_auto_keeps_the_cache_on_a_gpu_exactly_where_shards_vectorize():
    gpu = _digits("cuda", [1, 4])
    assert gpu["features"]["cache"] is True and {(m, n) for m, n, _, _ in vectorized_jobs(gpu)} == {
        ("fc", 4), ("nlft-1", 4)}
    assert _digits("cpu", [1, 4])["features"]["cache"] is True
    assert _digits("cuda", [1])["features"]["cache"] is False  # nothing vectorizes: recompute, as before
    off = {"fc": {"kind": "fc", "vectorized_shards": False}, "nlft-1": {"kind": "nlft", "k": 1, "vectorized_shards": False}}
    assert _digits("cuda", [1, 4], methods=off)["features"]["cache"] is False
    augmented = _digits("cuda", [1, 4], train={"augment": {"enabled": True}})  # augmentation: per-shard, from images
    assert augmented["features"]["cache"] is False and not vectorized_jobs(augmented)
    assert _digits("cuda", [1], features={"cache": True})["features"]["cache"] is True  # an explicit choice stands


@pytest.fixture(scope="module")
def fashion_path(tmp_path_factory):
    return fashion_mnist_path(tmp_path_factory.mktemp("fashion"))


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_each_study_file_validates_the_same_on_cuda_as_on_the_cpu(study, fashion_path):
    raw = yaml.safe_load(study.read_text())
    raw["dataset"]["path"] = str(fashion_path)
    cpu, gpu = (validate_config({**copy.deepcopy(raw), "device": d}) for d in ("cpu", "cuda"))
    assert gpu["features"]["cache"] is True and vectorized_jobs(gpu), "the study vectorizes its shards"
    assert vectorized_jobs(gpu) == vectorized_jobs(cpu)
    assert {**gpu, "device": "cpu"} == cpu  # the rules read nothing else that differs: the same plan
