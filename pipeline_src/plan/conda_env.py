"""The conda environment of every rule (`conda:` in workflow/rules/*.smk), generated from the lock.

`snakemake --software-deployment-method conda` builds `workflow/envs/pipeline.yaml` on the machine
that runs a job (a cluster node, say): CPython `LOCK_PYTHON` from conda-forge, then pip installs
the lock's pins of what the jobs import. That is the runtime closure of `[project].dependencies`:
the lock's `# via` comments give each pin's parents, so the test extra's tools (pytest, ruff,
snakefmt) stay out unless a runtime package needs them too. The file is written by `make
conda-env` (and by `make lock`; the standard library suffices), never by hand; `tests/plan/test_conda_env.py` checks that the
committed file is what the lock gives.

    python -m pipeline_src.plan.conda_env            # write workflow/envs/pipeline.yaml
    python -m pipeline_src.plan.conda_env --check    # exit 1 when it differs from the lock
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline_src.plan.environment import (
    LOCK_FILE,
    LOCK_PYTHON,
    PACKAGE_ROOT,
    PYPROJECT,
    _load_toml,
    read_lock,
)
from pipeline_src.plan.lock_graph import lock_closure, lock_parents, requirement_names  # noqa: F401 (re-exported)

ENV_FILE = PACKAGE_ROOT / "workflow" / "envs" / "pipeline.yaml"


def runtime_pins(lock: str | Path = LOCK_FILE, pyproject: str | Path = PYPROJECT) -> dict[str, str]:
    """The lock's pins that the jobs need: `[project].dependencies` and everything they require.

    Args:
        lock: the lock file.
        pyproject: the project's `pyproject.toml`.
    Raises:
        ValueError: a dependency of pyproject.toml has no pin (run `make lock`).
    """
    pins = read_lock(lock)
    roots = requirement_names(_load_toml(Path(pyproject))["project"]["dependencies"])
    missing = [r for r in roots if r not in pins]
    if missing:
        raise ValueError(f"{lock} has no pin for {missing} of {pyproject}: run `make lock`")
    return {n: pins[n] for n in sorted(lock_closure(roots, lock))}


def conda_env_text(lock: str | Path = LOCK_FILE, pyproject: str | Path = PYPROJECT) -> str:
    """The text of `workflow/envs/pipeline.yaml` for this lock.

    Args:
        lock: the lock file.
        pyproject: the project's `pyproject.toml`.
    """
    pins = runtime_pins(lock, pyproject)
    lines = [
        "# Generated from requirements.lock by `make conda-env` (pipeline_src/plan/conda_env.py): do not edit.",
        "# The software of every rule, for `snakemake --software-deployment-method conda`: CPython from",
        "# conda-forge, then the lock's pins of the jobs' runtime dependencies from PyPI.",
        "channels:",
        "  - conda-forge",
        "  - nodefaults",
        "dependencies:",
        f"  - python={LOCK_PYTHON}",
        "  - pip",
        "  - pip:",
        *[f"      - {name}=={version}" for name, version in pins.items()],
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or check) workflow/envs/pipeline.yaml from the lock.")
    parser.add_argument("--lock", default=str(LOCK_FILE))
    parser.add_argument("--pyproject", default=str(PYPROJECT))
    parser.add_argument("--out", default=str(ENV_FILE))
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs from what the lock gives")
    ns = parser.parse_args(argv)
    text = conda_env_text(ns.lock, ns.pyproject)
    out = Path(ns.out)
    if ns.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} does not match {ns.lock}: run `make conda-env`", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)  # a source file, not a result; the standard library only, so `make lock` runs it anywhere
    print(f"wrote {out} ({text.count('==')} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
