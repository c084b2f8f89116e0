"""tools/relayout.py (the lead re-runs it on merged trees): it moves old-layout modules, rewrites
their references, and a second run changes nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "tools" / "relayout.py"


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_this_tree_is_already_laid_out():
    out = run(REPO, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert [ln for ln in out.stdout.splitlines() if ln.startswith(("mv", "rm", "edit", "new"))] == []


def test_moves_rewrites_and_is_idempotent(tmp_path: Path):
    files = {
        "Snakefile": "include: 'workflow/rules/common.smk'\n",
        "workflow/rules/common.smk": "from pipeline_src.config import ConfigError, validate_config\n",
        "pipeline_src/__init__.py": "",
        "pipeline_src/config.py": "class ConfigError(ValueError):\n    pass\n",
        "pipeline_src/methods.py": "from pipeline_src.sharding import shard_ids\n",
        "pipeline_src/sharding.py": "def shard_ids():\n    pass\n",
        "pipeline_src/export.py": "from pipeline_src.methods import build\n",  # a module another branch added
        "pipeline_src/steps/__init__.py": "",
        "pipeline_src/steps/fuse.py": "from pipeline_src import report_fusion, atomic as at\n",
        "README.md": "python -m pipeline_src.audit x; see `pipeline_src/gpu_slots.py` and tests/test_slurm.py\n",
        "tests/__init__.py": "",
        "tests/test_dp_reference.py": "X = 1\n",
        "tests/test_dp_budget.py": "from tests.test_dp_reference import X\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    first = run(tmp_path)
    assert first.returncode == 0, first.stderr
    read = lambda name: (tmp_path / name).read_text()  # noqa: E731
    assert not (tmp_path / "pipeline_src/config.py").exists()
    assert "from pipeline_src.plan.config import" in read("workflow/rules/common.smk")
    assert read("pipeline_src/methods/registry.py") == "from pipeline_src.plan.sharding import shard_ids\n"
    assert read("pipeline_src/methods/export.py") == "from pipeline_src.methods.registry import build\n"
    fuse = read("pipeline_src/steps/fusion/fuse.py")
    assert "from pipeline_src.reports import fusion as report_fusion" in fuse
    assert "from pipeline_src.store import atomic as at" in fuse
    assert read("README.md") == ("python -m pipeline_src.store.audit x; see `pipeline_src/runner/gpu_slots.py` "
                                 "and tests/e2e/test_slurm.py\n")
    assert read("tests/dp/test_budget.py") == "from tests.dp.test_reference import X\n"
    assert (tmp_path / "pipeline_src/plan/__init__.py").exists() and (tmp_path / "tests/dp/__init__.py").exists()

    snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and ".git" not in p.parts}
    second = run(tmp_path)
    assert second.returncode == 0, second.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and ".git" not in p.parts} == snapshot

    # A merge that brings an old path back with other bytes is a conflict, reported and left alone.
    (tmp_path / "pipeline_src/config.py").write_text("# edited on another branch\n")
    third = run(tmp_path)
    assert third.returncode == 2 and "CONFLICT" in third.stderr
    assert (tmp_path / "pipeline_src/config.py").exists()
