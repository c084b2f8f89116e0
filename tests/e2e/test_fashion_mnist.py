"""The Fashion-MNIST study (`studies/fashion_mnist.yaml`) end to end on real data: Debian's
`dataset-fashion-mnist` IDX files, through every rule the study uses, to the report.

The study file is run as it is, with a second config file merged over it (Snakemake merges
`--configfile a b` key by key) that shrinks it to about 1,000 images and a couple of minutes:
- `dataset.limit_per_class: 60` (target: 60 per class and split, 900 images; the test split too,
  `test_limit_per_class: same`, where the study tests on every image) and
  `dataset.source_limit_per_class: 20` (source: 300 images);
- fewer epochs (`train.epochs: 3` with the step schedule's milestones moved to [1, 2];
  `backbone.pretrain.epochs: 1`; `privacy.epochs: 1`, `privacy.paper.epochs: 2`);
- fewer shards (`shards: [1, 2]`, the unlearning and fusion studies at N = 2, one removed
  shard and one forget fraction), since 300 training images cannot fill 50 shards, and one
  DP budget (ε = 8);
- one seed (every section), and the validation search at N = 1 and 2 for nlft-1 and taft-1 only
  (the paper's grid for each: 2 and 8 points, and the DP search's PT).
Everything else (methods, their kinds and protocols, the studies and their settings) is the
study file's. Skips without the package (the message names it); fails instead when
PIPELINE_REQUIRE_FASHION_MNIST=1 (CI).
"""
from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import REPO, results_of, snakemake
from tests.plan.test_idx_files import require_fashion_mnist

pytestmark = pytest.mark.e2e
STUDY = REPO / "studies" / "fashion_mnist.yaml"
SMALL = {
    "dataset": {"limit_per_class": 60, "test_limit_per_class": "same", "source_limit_per_class": 20},
    "shards": [1, 2],
    "train": {"epochs": 3, "schedule": {"milestones": [1, 2]}},
    "backbone": {"pretrain": {"epochs": 1, "schedule": {"warmup_epochs": 0}}},  # the far study warms up 2.4 epochs
    "forget": {"study": {"shards": [2], "removed_shards": [1], "requests_per_point": 1, "forget_fractions": [0.1]}},
    "fusion": {"shards": [2]},
    "privacy": {"epochs": 1, "paper": {"epochs": 2}, "public_train_size": 300,  # 60 x 5 classes, declared
                "epsilons": [8], "seeds": [0]},
    "seeds": [0],
    "search": {"methods": ["nlft-1", "taft-1"], "shards": [1, 2]},
}


@pytest.fixture(scope="module")
def fashion_study(tmp_path_factory) -> tuple[Path, float]:
    require_fashion_mnist()
    workdir = tmp_path_factory.mktemp("fashion")
    small = workdir / "small.yaml"
    small.write_text(yaml.safe_dump(SMALL))
    start = time.perf_counter()
    snakemake(workdir, "--cores", "2", "--configfile", str(STUDY), str(small))
    return workdir, time.perf_counter() - start


def test_every_rule_of_the_study_ran_on_real_data(fashion_study):
    workdir, seconds = fashion_study
    results = results_of(workdir, "fashion-far")
    samples = pq.read_table(results / "prepare" / "samples.parquet").to_pydict()
    assert 1000 <= len(samples["sample_id"]) <= 1300 and samples["sample_id"][0].startswith("train/")
    target = {c for c, t in zip(samples["class_name"], samples["task"]) if t == "target"}
    assert target == {"T-shirt/top", "Pullover", "Dress", "Coat", "Shirt"}
    study = yaml.safe_load(STUDY.read_text())
    logs = {p.relative_to(results / "logs").parts[0] for p in (results / "logs").rglob("*.log")}
    rules = ("prepare", "pretrain", "features", "train", "compose", "evaluate", "fusion_train", "fusion_match",
             "fuse", "train_private", "evaluate_private", "forget_manifest", "unlearn_drop", "unlearn_retrain",
             "unlearn_paragon", "unlearn_paragon_nonlinear", "validate", "select", "validate_private",
             "select_private", "baselines", "report")
    assert set(rules) <= logs, f"no job of rules {sorted(set(rules) - logs)} ran"
    for method, cfg in study["methods"].items():
        n = max(cfg.get("shards", [2]))  # full, scratch, nlft-2, taft-2: N = 1 only
        assert (results / "train" / method / f"n{n}_s0" / f"shard{n - 1}.safetensors").is_file()
    assert (results / "report" / "table1_methods.md").is_file()
    print(f"Fashion-MNIST subset study: {seconds:.0f} s")  # the budget: <= 180 s on an idle 2-core machine
