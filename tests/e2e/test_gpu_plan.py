"""The real `snakemake -n` of each study file plans no more jobs with `device: cuda` than with
`device: cpu` (issue 41, item 2; on b7c748c: 2,258 against 1,008 for studies/fashion_mnist.yaml,
2,130 against 880 for studies/fashion_near.yaml). About 20-35 s a dry run on 2 busy cores: a `long` module.
The dataset is Debian's Fashion-MNIST where installed, else IDX files of its shape
(tests/plan/fashion_like.py); the study files are used as they are, the path merged over them."""
from __future__ import annotations

import re

import pytest
import yaml

from tests.conftest import REPO, snakemake
from tests.plan.fashion_like import fashion_mnist_path

STUDIES = sorted((REPO / "studies").glob("*.yaml"))


def planned_jobs(proc) -> dict[str, int]:
    """The job counts per rule of a dry run's table (`rule  count` rows up to `total`)."""
    table = (proc.stdout + proc.stderr).split("Job stats:", 1)[1]
    rows = dict((rule, int(n)) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.M))
    assert "total" in rows, table[:2000]
    return rows


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_the_cuda_plan_has_no_more_jobs_than_the_cpu_plan(study, tmp_path):
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"dataset": {"path": str(fashion_mnist_path(tmp_path))}}))
    cpu, gpu = (planned_jobs(snakemake(tmp_path, "-n", "--configfile", str(study), str(data), "--config", f"device={d}"))
                for d in ("cpu", "cuda"))
    assert gpu["total"] <= cpu["total"], (gpu, cpu)
    vectorized = [sum(n for rule, n in jobs.items() if rule.startswith("train_vectorized")) for jobs in (gpu, cpu)]
    assert vectorized[0] == vectorized[1] > 0, vectorized  # one rule per vectorized job
    assert gpu.get("train", 0) <= cpu.get("train", 0)
