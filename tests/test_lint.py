"""The code and the workflow pass their linters: `ruff check` (rules in pyproject.toml: pyflakes,
import order, bugbear), `snakefmt --check` (the Snakefile and workflow/rules/*.smk) and
`snakemake --lint` on the default and the .test study. ruff and snakefmt come with the `test`
extra, so a missing one fails here instead of skipping."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
                         cwd=REPO, capture_output=True, text=True)
    assert "No module named ruff" not in out.stderr, "install the test extra: pip install -e '.[test]'"
    assert out.returncode == 0, out.stdout + out.stderr


def test_snakefmt_is_clean():
    """The workflow files are formatted as snakefmt (line length in pyproject.toml) writes them."""
    out = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "--diff", "."],
                         cwd=REPO, capture_output=True, text=True)
    assert "No module named snakefmt" not in out.stderr, "install the test extra: pip install -e '.[test]'"
    assert out.returncode == 0, "run `snakefmt .`:\n" + out.stdout + out.stderr


@pytest.mark.parametrize("configfile", ["config.yaml", ".test/config.yaml"])
def test_snakemake_lint_is_clean(configfile, tmp_path):
    """Every rule has a log and a conda env, rule files hold no functions, no hard-coded path
    params, environment variables declared (the snakemake-workflows catalogue's conventions)."""
    snakemake = [sys.executable, "-m", "snakemake"]
    out = subprocess.run([*snakemake, "--lint", "-s", str(REPO / "Snakefile"), "--configfile", str(REPO / configfile),
                          "--directory", str(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and "Lints for" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Congratulations, your workflow is in a good condition" in out.stdout + out.stderr
