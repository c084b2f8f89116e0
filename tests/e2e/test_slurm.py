"""The tiny study through `--profile workflow/profiles/slurm` on a real Slurm, against a local run.

Needs a running cluster: `sudo .ci/slurm-up.sh` starts a one-node one here. Without one the
tests are skipped, unless `PIPELINE_REQUIRE_SLURM=1` (set by `.ci/run`), which makes them fail:
CI must never skip them silently.

Each Slurm job pays two Snakemake start-ups and a torch import, and the plugin polls squeue at
growing intervals. By default, to stay within a few minutes, the test runs a sub-DAG locally
first, then reruns everything from `train` on through Slurm in a copy of that working directory,
for one method at one shard count (N shard models, their soup and ensemble: the full .test
config, restricted by targets so the test follows config changes).
`PIPELINE_SLURM_TEST_FULL=1` (set by `.ci/run`) runs the *whole* tiny study (target `all`:
every study, the report) locally, then again from scratch (`--forceall`) through Slurm.
Training is deterministic on the CPU (fixed seeds, fixed thread counts), so models and metrics
must be bit-identical.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.conftest import REPO, SNAKEMAKE, results_of

pytestmark = pytest.mark.e2e
PROFILE = REPO / "workflow" / "profiles" / "slurm"
SLURM_RULES = {"train", "compose", "evaluate_shards", "evaluate_soup"}
FULL = os.environ.get("PIPELINE_SLURM_TEST_FULL") == "1"
REQUIRED = os.environ.get("PIPELINE_REQUIRE_SLURM") == "1"
if FULL:  # the whole study also sends the data, pretraining, study and report jobs to Slurm
    SLURM_RULES |= {"prepare", "pretrain", "features", "report"}


def slurm_state() -> str | None:
    """Why the cluster cannot take jobs, or None when a node is idle or busy."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "the Slurm executor plugin is not installed (an extra since issue 44): run `make install-slurm`"
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
    if reason and REQUIRED:
        pytest.fail(f"PIPELINE_REQUIRE_SLURM=1 but {reason}", pytrace=False)
    if reason:
        pytest.skip(f"{reason} (PIPELINE_REQUIRE_SLURM=1 turns this skip into a failure)")


def snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 900):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # submit, not run in a job
    full_env.update(PYTHONPATH=str(REPO), **(env or {}))
    try:
        proc = subprocess.run([*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True,
                              env=full_env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # a killed Snakemake leaves its Slurm jobs queued: cancel them
        out = "".join(o.decode(errors="replace") if isinstance(o, bytes) else o or "" for o in (exc.stdout, exc.stderr))
        ids = re.findall(r"submitted with SLURM jobid (\d+)", out)
        if ids and shutil.which("scancel"):
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
        raise AssertionError(f"snakemake {' '.join(args)} ran over {timeout} s:\n{out[-4000:]}") from None
    if proc.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc


def accuracies(workdir: Path, step: str | None = "evaluate") -> list[tuple]:
    """Every accuracy row under results/metrics/<step>/ (None: every step), sorted, with the
    metrics file (relative to the working directory) and the row's variant as part of its key."""
    metrics = results_of(workdir) / "metrics" / (step or "")
    rows = duckdb.sql(f"""SELECT filename, method, shards, model, shard_id, variant, split, value FROM
        read_parquet('{metrics}/**/*.parquet', union_by_name=true, filename=true)
        WHERE metric = 'accuracy'""").fetchall()
    return sorted(((str(Path(r[0]).relative_to(workdir)), *r[1:]) for r in rows), key=repr)


def safetensors_content(path: Path) -> tuple[dict, bytes]:
    """The header (names, dtypes, shapes, offsets, metadata) as a dict, and the tensor bytes.
    The library writes `__metadata__` keys in no fixed order, so whole files may differ in bytes."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def targets(cfg: dict) -> list[str]:
    """Metrics files of one method at one shard count N > 1: its shard models with their ensemble, and soup;
    with PIPELINE_SLURM_TEST_FULL=1 the whole study (`all`)."""
    if FULL:
        return ["all"]
    method = "fc" if "fc" in cfg["methods"] else next(iter(cfg["methods"]))
    n = next(n for n in cfg["shards"] if n > 1)
    base = f"results/{cfg['experiment']}/metrics/evaluate/{method}/n{n}_s{cfg['seeds'][0]}"
    return [f"{base}/{c}.parquet" for c in ("shards", "soup")]


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory) -> tuple[Path, Path, str, float]:
    """(local workdir, Slurm workdir, Slurm run's log, Slurm run's start time)."""
    local = tmp_path_factory.mktemp("local")
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg.pop("search", None)  # its 40-odd grid-point jobs are the local e2e test's (test_search.py): CI's time
    (local / "config.yaml").write_text(yaml.safe_dump(cfg))
    wanted = targets(yaml.safe_load((local / "config.yaml").read_text()))
    snakemake(local, "--cores", "2", *wanted, timeout=2400 if FULL else 900)
    on_slurm = tmp_path_factory.mktemp("slurm") / "study"
    shutil.copytree(local, on_slurm)  # outputs, mtimes and .snakemake metadata
    rerun = ["--forceall"] if FULL else ["--forcerun", "train"]
    start = time.time()
    proc = snakemake(on_slurm, "--profile", str(PROFILE), *rerun, "--slurm-init-seconds-before-status-checks", "2",
                     "--slurm-keep-successful-logs", "--", *wanted, env={"PIPELINE_FORKSERVER": "0"},
                     timeout=3600 if FULL else 900)
    print(f"Slurm run of {' '.join(wanted) if FULL else f'{len(wanted)} targets'}: {time.time() - start:.0f} s")
    return local, on_slurm, proc.stdout + proc.stderr, start


def test_jobs_ran_as_slurm_jobs(runs):
    _, on_slurm, log, _ = runs
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: .*?/slurm_logs/rule_([^/ ]+?)[/ ]", log)
    assert SLURM_RULES <= {rule for _, rule in submitted}, log[-3000:]
    # every job that is not a localrule went to Slurm: one submission per `rule <name>:` job
    remote_jobs = re.findall(r"^rule ([^\s:]+):$", log, flags=re.M)
    assert sorted(remote_jobs) == sorted(rule for _, rule in submitted), log[-3000:]
    # each Slurm job's own log shows the job step ran the rule inside the allocation
    job_logs = list((on_slurm / ".snakemake" / "slurm_logs" / "rule_train").rglob("*.log"))
    assert len(job_logs) == sum(rule == "train" for _, rule in submitted) >= 2
    assert all("--executor slurm-jobstep" in p.read_text() for p in job_logs)


def test_every_output_arrives(runs):
    local, on_slurm, _, start = runs
    steps = [""] if FULL else ["train", "compose", "metrics/evaluate", "report"]
    # job outputs only: the parse-time cache (prepare/.plan_cache) and the content-addressed DP
    # provenance store are written once and reused, by design, not rewritten by --forceall
    not_outputs = (".plan_cache", "provenance")
    redone = [p for step in steps for p in (results_of(local) / step).rglob("*")
              if p.is_file() and not set(p.relative_to(results_of(local)).parts) & set(not_outputs)]
    assert len(redone) >= 2 + 2 + 2 + 4  # N=2 models and records, soup and record, 4 metrics files
    if FULL:
        assert (results_of(local) / "report" / "index.md") in redone
    for p in redone:
        twin = on_slurm / p.relative_to(local)
        assert twin.stat().st_mtime >= start, f"{twin} was not rewritten on Slurm"
        # only files empty locally may be empty (markers such as directory outputs' .snakemake_timestamp)
        assert twin.stat().st_size > 0 or p.stat().st_size == 0, f"{twin} is empty"
    dry = snakemake(on_slurm, "-n", "--cores", "1", *targets(yaml.safe_load((on_slurm / "config.yaml").read_text())))
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_models_and_metrics_match_the_local_run(runs):
    local, on_slurm, _, _ = runs
    models = sorted((results_of(local) / ("" if FULL else "train")).rglob("*.safetensors"))
    assert models
    for model in models:
        assert safetensors_content(model) == safetensors_content(on_slurm / model.relative_to(local)), model
    if not FULL:
        assert len(accuracies(local)) == len(targets(yaml.safe_load((local / "config.yaml").read_text())))
    expected, got = accuracies(local, None), accuracies(on_slurm, None)
    assert len(expected) > 0
    assert got == expected
