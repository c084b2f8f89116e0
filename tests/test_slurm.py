"""The tiny study through `--profile workflow/profiles/slurm` on a real Slurm, against a local run.

Needs a running cluster: `sudo .ci/slurm-up.sh` starts a one-node one here; skipped otherwise.
Each Slurm job pays two Snakemake start-ups and a torch import, and the plugin polls squeue at
growing intervals, so to stay within a few minutes the test runs the study locally first, then
reruns everything from `train` on through Slurm in a copy of that working directory, for one
method at one shard count (N shard models, their soup and ensemble: the full .test config,
restricted by targets so the test follows config changes). `PIPELINE_SLURM_TEST_FULL=1` sends
that whole sub-DAG (prepare, pretrain, split, ...) through Slurm instead. Training is deterministic on the CPU (fixed seeds, fixed thread counts), so models and metrics
must be bit-identical.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.e2e
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
PROFILE = REPO / "workflow" / "profiles" / "slurm"
SLURM_RULES = {"train", "compose", "evaluate_shard", "evaluate_soup", "evaluate_ensemble"}


def slurm_state() -> str | None:
    """Why the cluster cannot take jobs, or None when a node is idle or busy."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "Slurm is not installed (no sinfo/sbatch): run `sudo .ci/slurm-up.sh`"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20 s: slurmctld is not reachable"
    states = out.stdout.split()
    if out.returncode or not any(s.rstrip("*") in ("idle", "mixed", "allocated", "completing") for s in states):
        return f"no Slurm node accepts jobs (sinfo: {(out.stdout + out.stderr).strip()[:200]!r}): run `sudo .ci/slurm-up.sh`"
    return None


@pytest.fixture(scope="module")
def cluster() -> None:
    reason = slurm_state()
    if reason:
        pytest.skip(reason)


def snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 900):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # submit, not run in a job
    full_env.update(PYTHONPATH=str(REPO), **(env or {}))
    proc = subprocess.run([*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc


def accuracies(workdir: Path) -> dict[tuple, float]:
    rows = duckdb.sql(f"""SELECT method, shards, model, shard_id, value FROM
        read_parquet('{workdir}/results/metrics/evaluate/**/*.parquet', union_by_name=true)
        WHERE metric = 'accuracy'""").fetchall()
    return {tuple(r[:4]): r[4] for r in rows}


def targets(cfg: dict) -> list[str]:
    """Metrics files of one method at one shard count N > 1: its shard models, soup and ensemble."""
    method = "fc" if "fc" in cfg["methods"] else next(iter(cfg["methods"]))
    n = next(n for n in cfg["shards"] if n > 1)
    base = f"results/metrics/evaluate/{method}/n{n}_s{cfg['seeds'][0]}"
    return [f"{base}/shard{i}.parquet" for i in range(n)] + [f"{base}/{c}.parquet" for c in ("soup", "ensemble")]


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory) -> tuple[Path, Path, str, float]:
    """(local workdir, Slurm workdir, Slurm run's log, Slurm run's start time)."""
    local = tmp_path_factory.mktemp("local")
    shutil.copy(REPO / ".test" / "config.yaml", local / "config.yaml")
    wanted = targets(yaml.safe_load((local / "config.yaml").read_text()))
    snakemake(local, "--cores", "2", *wanted)
    on_slurm = tmp_path_factory.mktemp("slurm") / "study"
    shutil.copytree(local, on_slurm)  # outputs, mtimes and .snakemake metadata
    rerun = ["--forceall"] if os.environ.get("PIPELINE_SLURM_TEST_FULL") == "1" else ["--forcerun", "train"]
    start = time.time()
    proc = snakemake(on_slurm, "--profile", str(PROFILE), *rerun, "--slurm-init-seconds-before-status-checks", "2",
                     "--slurm-keep-successful-logs", "--", *wanted, env={"PIPELINE_FORKSERVER": "0"})
    return local, on_slurm, proc.stdout + proc.stderr, start


def test_jobs_ran_as_slurm_jobs(runs):
    _, on_slurm, log, _ = runs
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: .*?/slurm_logs/rule_(\w+?)[/ ]", log)
    assert SLURM_RULES <= {rule for _, rule in submitted}, log[-3000:]
    # each Slurm job's own log shows the job step ran the rule inside the allocation
    job_logs = list((on_slurm / ".snakemake" / "slurm_logs" / "rule_train").rglob("*.log"))
    assert len(job_logs) == 2 and all("--executor slurm-jobstep" in p.read_text() for p in job_logs)


def test_every_output_arrives(runs):
    local, on_slurm, _, start = runs
    redone = [p for step in ("train", "compose", "metrics/evaluate", "report")
              for p in (local / "results" / step).rglob("*") if p.is_file()]
    assert len(redone) >= 2 + 2 + 2 + 4  # N=2 models and records, soup and record, 4 metrics files
    for p in redone:
        twin = on_slurm / p.relative_to(local)
        assert twin.stat().st_size > 0 and twin.stat().st_mtime >= start, f"{twin} was not rewritten on Slurm"
    dry = snakemake(on_slurm, "-n", "--cores", "1", *targets(yaml.safe_load((on_slurm / "config.yaml").read_text())))
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_models_and_metrics_match_the_local_run(runs):
    local, on_slurm, _, _ = runs
    for model in sorted((local / "results" / "train").rglob("*.safetensors")):
        assert model.read_bytes() == (on_slurm / model.relative_to(local)).read_bytes(), model
    expected, got = accuracies(local), accuracies(on_slurm)
    assert len(expected) == len(targets(yaml.safe_load((local / "config.yaml").read_text())))
    assert got == expected
