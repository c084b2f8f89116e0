"""workflow/envs/pipeline.yaml (every rule's `conda:` env) is what the lock gives: the runtime
closure of pyproject.toml's dependencies at the lock's versions, without the test tools."""
from __future__ import annotations

import yaml

from pipeline_src.plan.conda_env import ENV_FILE, conda_env_text, lock_parents, main, runtime_pins
from pipeline_src.plan.environment import LOCK_PYTHON, read_lock
from tests.conftest import REPO


def test_the_committed_env_is_generated_from_the_lock():
    assert ENV_FILE.read_text() == conda_env_text(), "run `make conda-env` after `make lock`"
    assert main(["--check"]) == 0


def test_env_pins_the_runtime_closure_at_the_lock_versions():
    env = yaml.safe_load(ENV_FILE.read_text())
    deps = env["dependencies"]
    assert f"python={LOCK_PYTHON}" in deps and "pip" in deps
    pip = dict(line.split("==") for line in next(d["pip"] for d in deps if isinstance(d, dict)))
    lock = read_lock(REPO / "requirements.lock")
    assert all(lock[name] == version for name, version in pip.items())
    assert {"torch", "timm", "opacus", "snakemake", "numpy", "pyarrow", "filelock"} <= set(pip)  # filelock: torch's
    assert not {"pytest", "pytest-xdist", "ruff", "iniconfig"} & set(pip)  # the test extra only
    # closed: whatever a pinned package requires is pinned too
    parents = lock_parents(REPO / "requirements.lock")
    assert [(p, c) for c, ps in parents.items() for p in ps if p in pip and c not in pip] == []


def test_via_comments_of_both_shapes(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("a==1 \\\n    --hash=sha256:00\n    # via vit-compose-pipeline (pyproject.toml)\n"
                    "b==2 \\\n    --hash=sha256:00\n    # via a\n"
                    "c==3 \\\n    --hash=sha256:00\n    # via\n    #   a\n    #   d\n"
                    "d==4 \\\n    --hash=sha256:00\n    # via vit-compose-pipeline (pyproject.toml)\n")
    assert lock_parents(lock) == {"a": set(), "b": {"a"}, "c": {"a", "d"}, "d": set()}
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["a>=1"]\n[project.optional-dependencies]\ntest = ["d"]\n')
    assert runtime_pins(lock, pyproject) == {"a": "1", "b": "2", "c": "3"}
