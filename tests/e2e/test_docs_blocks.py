"""Every block of the README and docs/ marked `runnable` runs as written (issue 35).

The blocks run in a folder laid out like a fresh clone after `make install`: the checkout's files
(linked), `.venv/bin/python` and `.venv/bin/snakemake` (this interpreter), and the default study's
results folder `results/digits-transfer/` holding a copy of the finished tiny study's results, so
the queries read real metrics without running the default study. Snakemake commands there are dry
runs (a block that would run the study is marked `long`). Blocks that are the same text run once.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import tiny_config
from tests.test_docs import Block, command_blocks

pytestmark = pytest.mark.e2e
EXPERIMENT = "digits-transfer"  # the default study's (config.yaml), which the docs' examples name
SKIP = {".git", ".venv", "results", ".snakemake", ".pytest_cache", "__pycache__"}


def runnable() -> list[Block]:
    """The runnable blocks, each command text once (comments and spacing aside)."""
    seen, out = set(), []
    for b in command_blocks():
        key = (b.language, tuple(line.split(" #")[0].strip() for line in b.text.splitlines()))
        if b.markers == ("runnable",) and key not in seen:
            seen.add(key)
            out.append(b)
    return out


def study_results(tiny_study: Path) -> Path:
    """The tiny study's results folder: results/<experiment>/ in the per-study layout, else results/."""
    nested = tiny_study / "results" / tiny_config()["experiment"]
    return nested if nested.is_dir() else tiny_study / "results"


@pytest.fixture(scope="module")
def clone(tmp_path_factory, tiny_study) -> Path:
    work = tmp_path_factory.mktemp("docs_clone")
    for entry in REPO.iterdir():
        if entry.name not in SKIP:
            (work / entry.name).symlink_to(entry)
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, args in (("python", ""), ("snakemake", " -m snakemake")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {sys.executable}{args} "$@"\n')
        (bin_dir / name).chmod(0o755)
    shutil.copytree(study_results(tiny_study), work / "results" / EXPERIMENT, symlinks=True)
    return work


def test_there_are_runnable_blocks_of_each_kind():
    kinds = {b.language for b in runnable()}
    assert {"bash", "sql"} <= kinds, kinds


@pytest.mark.parametrize("block", runnable(), ids=lambda b: f"{b.page}:{b.line}")
def test_runnable_block(block: Block, clone: Path):
    if block.language == "sql":
        cmd = [str(clone / ".venv/bin/python"), "-m", "pipeline_src.store.query", "--results",
               f"results/{EXPERIMENT}", block.text]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user's shell has it
    proc = subprocess.run(cmd, cwd=clone, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"{block.page}:{block.line} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    if block.language == "sql":
        assert proc.stdout.strip(), "the query printed nothing"
