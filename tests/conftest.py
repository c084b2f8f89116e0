"""Shared fixtures: tiny timm ViTs in float64, small on-disk datasets, and real Snakemake runs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from tests.rounding_guard import ShapeKeyedRounding

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: float | None = None,
              **env: str) -> subprocess.CompletedProcess:
    """Run the real workflow in `workdir` with this checkout's package first on the path.

    Args:
        workdir: Snakemake's --directory (results/ lands there).
        args: Snakemake arguments (targets, -n, --cores, --configfile ...).
        check: raise, with the output's tail, when Snakemake fails.
        timeout: seconds before the run is killed.
        env: extra environment variables.
    """
    proc = subprocess.run([*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def results_of(workdir: Path, experiment: str | None = None) -> Path:
    """A study's results folder in `workdir`: `results/<experiment>` (`plan/studies.py`).

    Args:
        workdir: Snakemake's --directory.
        experiment: the study's name (default: the `experiment` of `workdir/config.yaml`).
    """
    if experiment is None:
        import yaml

        experiment = yaml.safe_load((workdir / "config.yaml").read_text())["experiment"]
    return workdir / "results" / experiment


def planned_outputs(proc: subprocess.CompletedProcess) -> list[str]:
    """The output files a (dry) run lists."""
    return re.findall(r"^\s+output: (.+)$", proc.stdout + proc.stderr, flags=re.M)


def tiny_vit(seed: int = 0, train: bool = False, **overrides) -> VisionTransformer:
    """A float64 timm ViT: img 16, patch 4, 1 channel, 5 classes, D 32, depth 2, 4 heads.

    Args:
        seed: torch's seed for the initialisation (same seed, same weights).
        train: training mode (Opacus refuses a model in eval mode); eval mode by default.
        overrides: VisionTransformer kwargs replacing those above (e.g. depth=4, global_pool="avg").
    """
    kwargs = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return VisionTransformer(**kwargs).double().train(train)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """An ImageFolder tree: 3 classes x 6 PNG images of 12x12 pixels."""
    from PIL import Image

    root = tmp_path / "shapes"
    rng = np.random.default_rng(0)
    for c in ("circle", "square", "triangle"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8)).save(root / c / f"img{i}.png")
    return root


def pytest_addoption(parser) -> None:
    parser.addoption("--rounding-guard", action="store_true",
                     help="run every test under tests/rounding_guard.ShapeKeyedRounding (an audit for "
                          "assertions of bit-equality the code does not guarantee)")


@pytest.fixture(autouse=True)
def rounding_guard(request):
    """Tests marked `rounding_guard` (or every test, with --rounding-guard) run under
    `ShapeKeyedRounding`: a `torch.equal` between results of different shapes, layouts or thread
    counts then fails here as it may on another CPU (tests/rounding_guard.py)."""
    if request.node.get_closest_marker("rounding_guard") or request.config.getoption("--rounding-guard"):
        with ShapeKeyedRounding():
            yield
    else:
        yield


@pytest.fixture(scope="module")
def float64_default():
    """Run a test module with float64 as torch's default dtype (also for its module-scoped
    fixtures), restoring the old default after."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# The longest modules first, so that the workers (pytest-xdist, one module per worker, taken in
# collection order with --no-loadscope-reorder) do not end on one long module while the other
# worker idles. The first end-to-end module builds the shared tiny study (tests/e2e/conftest.py)
# while the other worker runs the modules that do not need it (every other end-to-end module
# comes after those). Only the order changes, never what runs.
RUN_FIRST = (
    "tests/e2e/test_privacy.py",      # the shared tiny study, then the DP study
    "tests/e2e/test_slurm.py",        # its own study, locally and through Slurm (when a cluster is up)
    "tests/steps/test_memory.py",     # prepare, features and train at two dataset sizes
    "tests/e2e/test_reliability.py",
    "tests/e2e/test_interrupt.py",
    "tests/e2e/test_fusion.py",
    "tests/e2e/test_workflow.py",     # the first of `make test`: it builds the tiny study
)
# `make test` (within 5 min on 2 cores) runs every module but the `long` ones; `make test-long`
# runs those (CI runs both). The end-to-end modules `make test` keeps: the tiny study with its
# checks, the golden accuracies, the README's blocks and queries, and the validation search.
QUICK_E2E = ("test_workflow.py", "test_golden.py", "test_docs_blocks.py", "test_readme_queries.py", "test_search.py")
LONG = ("tests/steps/test_memory.py",)


def is_long(module: str) -> bool:
    """A module of `make test-long`: every end-to-end module but QUICK_E2E, and LONG."""
    return module in LONG or (module.startswith("tests/e2e/") and module.rsplit("/", 1)[1] not in QUICK_E2E)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {path: i for i, path in enumerate(RUN_FIRST)}
    for item in items:
        if is_long(item.nodeid.split("::")[0]):
            item.add_marker(pytest.mark.long)

    def order(item) -> int:  # stable: the rest keep their order
        module = item.nodeid.split("::")[0]
        return rank.get(module, len(rank) + module.startswith("tests/e2e/"))

    items.sort(key=order)
