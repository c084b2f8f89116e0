"""The digits images, read from scikit-learn's CSV without importing it, against its own `load_digits`
(the reference), and a fork server that no longer preloads scikit-learn (issue 44: 0.6-1 CPU-s of
every study's start)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from tests.conftest import REPO


def test_digits_images_equal_scikit_learns():
    from sklearn.datasets import load_digits

    from pipeline_src.data.images import digits_images

    ref = load_digits().images
    got = digits_images()
    assert got.dtype == ref.dtype and got.shape == (1797, 8, 8)
    assert np.array_equal(got, ref)  # the same CSV through the same float64 parse


def _fresh(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_the_digits_store_and_the_fork_servers_preload_import_no_scikit_learn():
    images = _fresh("import sys\nfrom pipeline_src.data.images import _digits\n"
                    "x = _digits(16, 3)\nassert x.shape == (1797, 3, 16, 16), x.shape\n"
                    "print('sklearn' in sys.modules)")
    assert images == "False"
    server = _fresh("import sys, importlib\nfrom pipeline_src.runner import forkserver\n"
                    "for m in forkserver.PRELOAD: importlib.import_module(m)\n"
                    "forkserver.preload_steps()\nprint(sorted(k for k in ('sklearn', 'matplotlib') if k in sys.modules))")
    assert server == "[]"
