"""The pinned environment (issue 17): the fingerprint in every record and row, the lock's
agreement with pyproject.toml, and the start-up warning when installed versions drift."""
from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline_src.plan import environment
from pipeline_src.plan.environment import check_lock, fingerprint, fingerprint_json, lock_drift, read_lock
from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows
from pipeline_src.store.metrics import SCHEMA_VERSION, metric_rows, write_metrics
from pipeline_src.store.model_io import load_model, save_model
from pipeline_src.store.provenance import git_commit
from pipeline_src.store.results_db import connect
from tests.conftest import REPO

LOCK = REPO / "requirements.lock"
PYPROJECT = REPO / "pyproject.toml"
KEYS = {"python", "torch", "cuda", "cudnn", "timm", "opacus", "snakemake", "numpy", "commit", "dirty"}


def test_fingerprint_names_the_running_versions_and_commit():
    import numpy
    import opacus
    import snakemake
    import timm

    fp = fingerprint()
    assert set(fp) == KEYS
    assert fp["python"] == platform.python_version() and fp["torch"] == torch.__version__
    assert fp["cuda"] == torch.version.cuda
    assert (fp["timm"], fp["opacus"], fp["numpy"]) == (timm.__version__, opacus.__version__, numpy.__version__)
    assert fp["snakemake"] == snakemake.__version__
    assert fp["commit"] + ("-dirty" if fp["dirty"] else "") == git_commit()
    assert json.loads(fingerprint_json()) == fp


def test_importing_the_module_imports_no_torch():
    # The Snakefile imports it at parse time, which must stay torch-free.
    code = "import sys; import pipeline_src.plan.environment; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO).stdout
    assert out.strip() == "False"


def test_a_model_record_carries_the_fingerprint(tmp_path):
    weights = tmp_path / "results" / "train" / "fc" / "n1_s0" / "shard0.safetensors"
    save_model({"head.weight": torch.ones(2, 3)}, {"method": "fc", "shard_id": 0}, weights)
    _, record = load_model(weights)
    assert record["environment"] == fingerprint() and record["method"] == "fc"
    torch_of = connect(tmp_path / "results").sql("SELECT environment.torch FROM models").fetchall()
    assert torch_of == [(torch.__version__,)]


def _context(**extra) -> dict:
    return dict(experiment="e", dataset="digits", method="fc", kind="fc", model="shard", shards=1, shard_id=0,
                seed=0, split="test", num_samples=10, **extra)


def test_a_metrics_file_carries_the_fingerprint_and_the_environments_view_groups_by_it(tmp_path):
    results = tmp_path / "results"
    rows = metric_rows({"accuracy": 0.5, "loss": 1.0}, context=_context(), device=torch.device("cpu"), wall_time_s=1.0)
    write_metrics(rows, results / "metrics" / "evaluate" / "new.parquet")
    table = pq.read_table(results / "metrics" / "evaluate" / "new.parquet")
    assert table.schema.field("environment").type == pa.string()
    envs = table.column("environment").to_pylist()
    assert len(envs) == 2 and all(json.loads(e) == fingerprint() for e in envs)
    assert set(table.column("schema_version").to_pylist()) == {SCHEMA_VERSION} and SCHEMA_VERSION == 2

    # A schema-version-1 file (before the column) reads beside it, with a NULL environment.
    old = [{k: v for k, v in r.items() if k != "environment"} | {"schema_version": 1, "value": 0.25} for r in rows]
    old_schema = pa.schema([f for f in pq.read_schema(results / "metrics" / "evaluate" / "new.parquet")
                            if f.name != "environment"])
    pq.write_table(pa.Table.from_pylist(old, schema=old_schema), results / "metrics" / "evaluate" / "old.parquet")
    con = connect(results)
    by_env = con.sql("""SELECT schema_version, environment->>'torch', value FROM metrics
                        WHERE metric = 'accuracy' ORDER BY schema_version""").fetchall()
    assert by_env == [(1, None, 0.25), (2, torch.__version__, 0.5)]
    envs = con.sql("SELECT torch, timm, commit, dirty, metric_rows FROM environments ORDER BY torch NULLS FIRST").fetchall()
    fp = fingerprint()
    assert envs == [(None, None, None, None, 2), (fp["torch"], fp["timm"], fp["commit"], fp["dirty"], 2)]


def test_a_benchmark_row_carries_the_fingerprint(tmp_path):
    row = benchmark_row("bench", "case", "cpu", {"batch": 1}, [1.0, 2.0, 3.0], 4.0)
    path = write_benchmark_rows("bench", [row], tmp_path / "benchmarks")
    (env,) = pq.read_table(path).column("environment").to_pylist()
    assert json.loads(env) == fingerprint()
    got = connect(tmp_path).sql("SELECT environment->>'opacus', time_ms_median FROM benchmarks").fetchall()
    assert got == [(fingerprint()["opacus"], 2.0)]


# --- the lock and pyproject.toml -------------------------------------------------------------

def test_the_repository_lock_agrees_with_pyproject():
    assert check_lock(LOCK, PYPROJECT) == []
    pins = read_lock(LOCK)
    for name in ("torch", "timm", "opacus", "snakemake", "numpy", "pytest"):
        assert name in pins, name


def _edited_lock(tmp_path: Path, old: str, new: str) -> Path:
    text = LOCK.read_text()
    assert old in text
    path = tmp_path / "requirements.lock"
    path.write_text(text.replace(old, new, 1))
    return path


def test_a_pin_outside_pyprojects_range_fails(tmp_path):
    timm = "timm==" + read_lock(LOCK)["timm"]
    lock = _edited_lock(tmp_path, timm + " \\", "timm==0.9.16 \\")
    problems = check_lock(lock, PYPROJECT)
    assert len(problems) == 1 and "'timm>=1.0'" in problems[0] and "timm==0.9.16" in problems[0]
    assert environment.main(["--check-lock", str(lock), "--pyproject", str(PYPROJECT)]) == 1


def test_a_requirement_without_a_pin_fails(tmp_path):
    # pyproject gains a dependency that nobody re-locked
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(PYPROJECT.read_text().replace('test = ["pytest>=8"', 'test = ["pytest>=8", "hypothesis>=6"', 1))
    problems = check_lock(LOCK, pyproject)
    assert len(problems) == 1 and "optional-dependencies.test requires 'hypothesis>=6'" in problems[0]
    assert "make lock" in problems[0]


def test_a_lock_entry_without_a_hash_or_pin_is_rejected(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("timm==1.0.31 \\\n    --hash=sha256:00\nnumpy==2.4.6\n")
    with pytest.raises(ValueError, match=r"requirements.lock:3: 'numpy==2.4.6' has no --hash"):
        read_lock(lock)
    lock.write_text("timm>=1.0 \\\n    --hash=sha256:00\n")
    with pytest.raises(ValueError, match=r"requirements.lock:1: 'timm>=1.0' is not pinned"):
        read_lock(lock)


# --- the start-up warning ----------------------------------------------------------------------

def test_drift_names_packages_whose_installed_version_differs(tmp_path):
    import numpy

    lock = _edited_lock(tmp_path, f"numpy=={numpy.__version__} \\", "numpy==1.0.0 \\")
    assert ("numpy", "1.0.0", numpy.__version__) in lock_drift(lock)


def test_versions_compare_as_pep440_and_a_local_build_label_differs(tmp_path):
    import numpy

    v = numpy.__version__
    assert all(n != "numpy" for n, *_ in lock_drift(_edited_lock(tmp_path, f"numpy=={v} \\", f"numpy=={v}.0 \\")))
    assert ("numpy", f"{v}+cpu", v) in lock_drift(_edited_lock(tmp_path, f"numpy=={v} \\", f"numpy=={v}+cpu \\"))


def test_the_warning_fires_once_on_a_mismatch(tmp_path, monkeypatch, caplog):
    import numpy

    lock = _edited_lock(tmp_path, f"numpy=={numpy.__version__} \\", "numpy==1.0.0 \\")
    monkeypatch.setattr(environment, "_warned", False)
    logger = logging.getLogger("test-environment")
    with caplog.at_level(logging.WARNING, logger="test-environment"):
        message = environment.warn_on_lock_drift(logger, lock)
        assert environment.warn_on_lock_drift(logger, lock) is None  # once per process
    assert f"numpy {numpy.__version__} (lock: 1.0.0)" in message
    assert [r.getMessage() for r in caplog.records] == [f"Environment: {message}"]


def test_no_warning_when_the_installed_versions_match(tmp_path, monkeypatch, caplog):
    # A lock of exactly the installed versions of a few packages (hashes are not compared).
    import numpy

    lock = tmp_path / "requirements.lock"
    lock.write_text(f"numpy=={numpy.__version__} \\\n    --hash=sha256:00\n")
    monkeypatch.setattr(environment, "LOCK_PYTHON", ".".join(platform.python_version_tuple()[:2]))
    monkeypatch.setattr(environment, "_warned", False)
    with caplog.at_level(logging.WARNING):
        assert environment.warn_on_lock_drift(logging.getLogger("test-environment"), lock) is None
    assert not caplog.records


@pytest.mark.e2e
def test_snakemake_logs_the_drift_warning_once_at_start_up(tmp_path):
    # The real workflow from a tree whose lock pins another numpy; the cheapest real job.
    import numpy

    tree = tmp_path / "repo"
    tree.mkdir()
    for name in ("Snakefile", "workflow", "pipeline_src"):
        (tree / name).symlink_to(REPO / name)
    _edited_lock(tree, f"numpy=={numpy.__version__} \\", "numpy==1.0.0 \\")
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.yaml").write_text((REPO / ".test" / "config.yaml").read_text())
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(tree / "Snakefile"),
                           "--directory", str(work), "--cores", "1", "results/tiny/prepare/samples.parquet"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = f"numpy {numpy.__version__} (lock: 1.0.0)"
    out = proc.stdout + proc.stderr
    assert out.count("Environment: ") == 1 and expected in out
    (log,) = (work / ".snakemake" / "log").glob("*.snakemake.log")
    assert log.read_text().count("Environment: ") == 1 and expected in log.read_text()
