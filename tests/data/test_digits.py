"""The digits images, read from scikit-learn's CSV without importing it, against its own `load_digits`
(the reference). The fork server's preload: tests/runner/test_preload.py."""
from __future__ import annotations

import numpy as np


def test_digits_images_equal_scikit_learns():
    from sklearn.datasets import load_digits

    from pipeline_src.data.images import digits_images

    ref = load_digits().images
    got = digits_images()
    assert got.dtype == ref.dtype and got.shape == (1797, 8, 8)
    assert np.array_equal(got, ref)  # the same CSV through the same float64 parse
