"""A probe job for `test_cpu_threads.py`: run by a job process as `call(step, args)`; it loads
torch (and so libgomp, which reads its wait policy then) and runs one parallel op."""
from __future__ import annotations


def parallel_op(step: str, args) -> int:
    import torch

    torch.set_num_threads(2)
    torch.ones(1 << 20).sum()  # large enough for an OpenMP parallel region
    return 0
