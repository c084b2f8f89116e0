"""Fashion-MNIST's IDX files, or files of its shape where Debian's package is absent: 60,000
training and 10,000 test images of 28 x 28, 6,000 and 1,000 a class (the real set's counts), so
a study file's plan (shard sizes, hence which shards vectorize) is the one the real data gives."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.plan.test_idx_files import FASHION, idx_bytes, write


def fashion_mnist_path(tmp: Path) -> Path:
    """The real files' folder when installed, else files of their shape written under `tmp`.

    Args:
        tmp: a scratch folder (about 170 kB is written: the images are flat squares, gzipped).
    """
    if (FASHION / "train-images-idx3-ubyte.gz").is_file():
        return FASHION
    for prefix, n in (("train", 60000), ("t10k", 10000)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = np.zeros((n, 28, 28), np.uint8)
        images[:, 10:18, 10:18] = (labels * 25)[:, None, None]  # one grey square per class
        write(tmp / f"{prefix}-images-idx3-ubyte", idx_bytes(images), gz=True)
        write(tmp / f"{prefix}-labels-idx1-ubyte", idx_bytes(labels), gz=True)
    return tmp
