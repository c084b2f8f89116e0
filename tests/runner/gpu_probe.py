"""Probe jobs for the GPU job server's tests (`test_gpu_server.py`): run by a worker as
`call(step, args)`; `step` says what the job does, `args` is a dict of paths."""
from __future__ import annotations

import json
import os
import sys
import time
import types

import numpy as np


def state(step: str, args: dict) -> int:
    """Write what a job sees of the worker (pid, cwd, an env variable, torch's switches), then
    change those switches, as a careless job could."""
    import torch

    from pipeline_src.store.atomic import write_json

    write_json({"pid": os.getpid(), "cwd": os.getcwd(), "probe_env": os.environ.get("PROBE_ENV"),
                "grad": torch.is_grad_enabled(), "dtype": str(torch.get_default_dtype()),
                "cudnn_benchmark": torch.backends.cudnn.benchmark, "threads": torch.get_num_threads(),
                "umask": os.umask(0o022)}, args["out"])
    torch.set_grad_enabled(False)
    torch.set_default_dtype(torch.float64)
    torch.backends.cudnn.benchmark = True
    os.chdir("/")
    return 0


def slow_write(step: str, args: dict) -> int:
    """Write the output's bytes into a temporary file, say so, then wait before the rename: a job
    killed meanwhile must leave no output."""
    from pipeline_src.store.atomic import atomic_path

    with atomic_path(args["out"]) as tmp:
        tmp.write_text("half")
        with open(args["started"], "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(float(args.get("sleep", 30)))
        tmp.write_text("whole")
    return 0


def allocate(step: str, args: dict) -> int:
    """Hold `args["mb"]` MiB, every page written, for the job's length."""
    a = np.empty(int(args["mb"]) << 20, np.uint8)
    a[::4096] = 1
    return 0


def execute_step(step: str, args) -> int:
    """Run the real `execute` (log redirection, counters) on a step module defined here: `ok`
    writes a line to stdout, `fail` raises."""
    from pipeline_src.runner.execute import execute
    from pipeline_src.store import job_counters

    job_counters.write_counters = lambda *a: None  # tested in tests/store/test_job_counters.py

    def main(a) -> None:
        print(f"probe job {step} in {os.getpid()}", flush=True)
        if step == "fail":
            raise RuntimeError("probe failure: the job's error")

    mod = types.ModuleType("pipeline_src.steps._gpu_probe")
    mod.main = main
    sys.modules[mod.__name__] = mod
    return execute("_gpu_probe", args)


def first_batch(step: str, args: dict) -> int:
    """A model's first batch on the worker's device (CUDA where visible); writes the wall clock
    when it is done and whether the worker's context was already open."""
    import torch

    from pipeline_src.store.atomic import write_json

    cuda = torch.cuda.is_available()
    warm = torch.cuda.is_initialized() if cuda else None
    dev = torch.device("cuda" if cuda else "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 10)).to(dev)
    loss = model(torch.randn(32, 64, device=dev)).logsumexp(1).mean()
    loss.backward()
    float(loss)  # synchronises
    write_json({"t_first_batch": time.time(), "pid": os.getpid(), "warm": warm, "device": str(dev)}, args["out"])
    return 0


def read(path) -> dict:
    with open(path) as fh:
        return json.load(fh)
