"""One tiny study for the whole test session.

`tiny_study` runs the `.test` study once, on the CPU, with its GPU jobs on a fake 2-GPU
machine. Modules that only read a finished study (or dry-run against it) use it as it is.
Modules that run jobs of their own first `copy_study` it into their own folder: the copy keeps
the files' times and Snakemake's metadata (params, code, inputs of every output), so Snakemake
there reruns only what their config changes, and a prepared dataset, backbone and feature
caches are never built twice in one session.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml
from filelock import FileLock

from tests.conftest import REPO, results_of, snakemake

# What every study of the same dataset, backbone and seed shares: the prepared samples, the
# backbone (and its metrics row), the feature caches and the upstream signature they depend on.
DONE = ".tiny_study_done"  # written after the study finished
PREPARED = ("prepare", "pretrain", "metrics/pretrain", "features", "signatures/upstream.json")


def tiny_config() -> dict:
    """The `.test` study's config, as a fresh dict."""
    return yaml.safe_load((REPO / ".test" / "config.yaml").read_text())


def tiny_dp_config() -> dict:
    """The `.test` study cut to one DP job: taft-1 at N = 1, the fc regime, ε = 8, one epoch."""
    cfg = tiny_config()
    for study in ("fusion", "forget", "last_grid", "search"):
        cfg.pop(study, None)
    cfg["device"] = "cpu"
    cfg["methods"] = {"taft-1": {"kind": "taft", "k": 1}}
    cfg["shards"] = [1]
    cfg["privacy"] = {"enabled": True, "methods": ["taft-1"], "regimes": ["fc"], "epsilons": [8], "shards": [1],
                      "epochs": 1, "batch_size": 64, "public_train_size": 500}
    return cfg


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory) -> Path:
    """The finished `.test` study (device cpu; each GPU job held one of 2 fake device slots).

    Read it, or dry-run against it; never write into it: copy it with `copy_study` first.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # one study for all the workers of a `pytest -n` run
    workdir = root / "tiny_study"
    with FileLock(f"{workdir}.lock"):  # the first worker builds it; the others wait, then read it
        if not (workdir / DONE).exists():
            shutil.rmtree(workdir, ignore_errors=True)  # a half-built study of a worker that failed
            workdir.mkdir()
            cfg = tiny_config()
            cfg["device"] = "cpu"  # the golden accuracies are CPU numbers, whatever machine runs the tests
            cfg["resources"] = {"gpu": 1}
            (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
            snakemake(workdir, "--cores", "2", "--resources", "gpu=2", PIPELINE_NUM_GPUS="2",
                      PIPELINE_GPU_LOCK_DIR=str(workdir / "gpu-locks"))
            (workdir / DONE).touch()
    return workdir


def copy_study(study: Path, dst: Path, parts: tuple[str, ...] | None = PREPARED) -> Path:
    """Copy a finished study's results into `dst` (created), with Snakemake's metadata.

    Args:
        study: a finished study's working directory.
        dst: the new working directory (its config.yaml is the caller's to write).
        parts: only these files or folders under results/<experiment>/ (default: the prepared
            study, `PREPARED`); None: all of it.
    Returns:
        dst.
    """
    dst.mkdir(parents=True, exist_ok=True)
    src_results = results_of(study)  # the copy is of the same study (experiment): results/<experiment>/
    for part in parts if parts is not None else sorted(p.name for p in src_results.iterdir()):
        src, out = src_results / part, dst / "results" / src_results.name / part
        if src.is_dir():
            shutil.copytree(src, out, copy_function=shutil.copy2)
        elif src.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)
    # Metadata of outputs that are not copied is never read: Snakemake looks it up per existing file.
    shutil.copytree(study / ".snakemake" / "metadata", dst / ".snakemake" / "metadata", copy_function=shutil.copy2)
    return dst


@pytest.fixture
def sockets():
    """A test's own TMPDIR for its job servers, short enough that their Unix sockets live in it
    (a pytest folder under xdist is not: `runner/forkserver.socket_in_tmp`)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="vp", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
