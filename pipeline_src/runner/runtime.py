"""Per-job runtime set-up: device choice, thread count and seeds."""
from __future__ import annotations

import os
import random

import numpy as np
import torch

from pipeline_src.runner.cpu_threads import job_threads, usable_cpus


def resolve_device(setting: str = "auto") -> torch.device:
    """`auto` picks the GPU the job was given (CUDA_VISIBLE_DEVICES), else the CPU."""
    if setting == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config key 'device': 'cuda' requested but no GPU is visible to this job")
    if setting in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def set_up_job(threads: int, seed: int) -> None:
    """Pin torch to the job's declared threads, no more than the CPUs the process may use
    (affinity, cgroup quota: `cpu_threads.job_threads`), and seed every generator."""
    usable = job_threads(threads)
    if usable < threads:
        print(f"[threads] {usable} intra-op thread(s), not the declared {threads}: the process may use "
              f"{usable_cpus()} CPU(s) (affinity, cgroup cpu quota)", flush=True)
    torch.set_num_threads(usable)
    os.environ.setdefault("OMP_NUM_THREADS", str(usable))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def use_bf16(precision: str, device: torch.device) -> bool:
    """Whether a job runs its model under bfloat16 autocast: `train.precision: bfloat16` on CUDA.
    On the CPU it stays float32, so CPU results never depend on the setting."""
    return precision == "bfloat16" and device.type == "cuda"
