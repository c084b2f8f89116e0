"""A GPU job server's worker: one process that opens its device's CUDA context once and then runs
job after job in it, each in the job's working directory, environment, umask and log.

A worker is forked by the server (`gpu_server.py`, which never touches CUDA) with the environment
of its first job, so `CUDA_VISIBLE_DEVICES` and the MPS variables of that job hold for its
context; the server sends it only jobs with the same values (`worker_key`). Between jobs it
restores what a job may change in the process: its stdout/stderr (the job's log replaced them),
working directory, environment, umask, import path, signal handlers and torch's process-wide
switches (grad mode, default dtype, the cuDNN and TF32 flags, float32 matmul precision,
determinism). Each job seeds every generator and sets its thread count itself
(`runtime.set_up_job`). The CUDA caching allocator's blocks are returned after each job
(`torch.cuda.empty_cache`), so the next job, or another worker under MPS, gets the memory.

A worker whose job failed exits after reporting it: a failed CUDA job may have left the context
unusable (a device-side assert poisons it for the process), and a fresh worker costs one context.
A worker also retires after `MAX_JOBS_PER_WORKER` jobs, so what a job leaks stays bounded.

The job's peak RSS is the process's high-water mark reset before the job (`/proc/self/clear_refs`,
then `VmHWM` after it): a reused process cannot be reaped per job with `os.wait4`.
"""
from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import sys
import traceback

from pipeline_src.runner.job_process import PR_SET_PDEATHSIG, resolve

MAX_JOBS_PER_WORKER = 200
# What a job's CUDA context depends on: a worker serves only jobs whose values equal its first job's.
CONTEXT_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MPS_PIPE_DIRECTORY",
               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "PYTORCH_CUDA_ALLOC_CONF")


def worker_key(env: dict[str, str]) -> tuple[str | None, ...]:
    """The values of `CONTEXT_ENV` in a job's environment (None: unset)."""
    return tuple(env.get(name) for name in CONTEXT_ENV)


def warm_up() -> str:
    """Open the CUDA context and the cuBLAS and cuDNN handles a job's first batch would open; the
    device's name, or "cpu" where no GPU is visible (the server's logic is the same there)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    dev = torch.device("cuda", 0)
    a = torch.randn(64, 64, device=dev)
    (a @ a).sum().item()  # cuBLAS handle
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (a @ a).sum().item()  # cuBLASLt in bf16
    torch.nn.functional.conv2d(torch.randn(1, 3, 32, 32, device=dev), torch.randn(8, 3, 16, 16, device=dev),
                               stride=16).sum().item()  # cuDNN handle (the patch embedding)
    torch.cuda.synchronize()
    return torch.cuda.get_device_name(0)


def torch_switches() -> dict:
    """torch's process-wide settings a job may change (restored after each job)."""
    import torch

    return {"grad": torch.is_grad_enabled(), "dtype": torch.get_default_dtype(),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "cudnn": (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
                      torch.backends.cudnn.allow_tf32, torch.backends.cudnn.enabled),
            "cuda_tf32": torch.backends.cuda.matmul.allow_tf32}


def restore_torch(saved: dict) -> None:
    """Put back what `torch_switches` saved and hand the allocator's cached blocks back."""
    import torch

    torch.set_grad_enabled(saved["grad"])
    torch.set_default_dtype(saved["dtype"])
    torch.set_float32_matmul_precision(saved["matmul_precision"])
    torch.use_deterministic_algorithms(saved["deterministic"])
    (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32,
     torch.backends.cudnn.enabled) = saved["cudnn"]
    torch.backends.cuda.matmul.allow_tf32 = saved["cuda_tf32"]
    gc.collect()  # the job's tensors, before the cache is emptied
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def reset_peak_rss() -> bool:
    """Reset this process's resident high-water mark (Linux 4.0+); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_kib() -> int | None:
    """`VmHWM` of this process in KiB: its peak since the last `reset_peak_rss`."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def run_job(request: dict) -> tuple[int, int | None]:
    """Run one job in this process and put the process back as it was; (exit status, peak RSS KiB)."""
    saved_fds = os.dup(1), os.dup(2)  # the job's log replaces them (`execute.py`)
    saved = {"cwd": os.getcwd(), "env": dict(os.environ), "path": list(sys.path),
             "signals": {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}, "torch": torch_switches()}
    measured = reset_peak_rss()
    umask = os.umask(request["umask"])
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["sys_path"] + [p for p in sys.path if p not in request["sys_path"]]
        code = int(resolve(request["call"])(request["step"], request["args"]) or 0)
    except BaseException:  # anything, SystemExit from a step included: into the job's log
        traceback.print_exc()
        code = code or 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        for fd, copy in zip((1, 2), saved_fds):
            os.dup2(copy, fd)
            os.close(copy)
        os.chdir(saved["cwd"])
        os.umask(umask)
        os.environ.clear()
        os.environ.update(saved["env"])
        sys.path[:] = saved["path"]
        for s, handler in saved["signals"].items():
            signal.signal(s, handler)
        restore_torch(saved["torch"])
    return code, peak_rss_kib() if measured else None


def worker_main(conn: socket.socket, first: dict) -> None:
    """The worker's life: warm up with the first job's environment, then run the jobs the server
    sends until it closes the connection, a job fails, or `MAX_JOBS_PER_WORKER` are done.

    Args:
        conn: the worker's end of its socket pair with the server.
        first: the first job's request (its environment sets up the CUDA context).
    """
    from pipeline_src.runner.forkserver import _recv, _send

    code = 0
    try:
        # its own process group from the fork (`fork_in_own_group`): the server kills it and a job's loaders at once
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the server
        os.environ.clear()
        os.environ.update(first["env"])
        warm_up()
        request, served = first, 0
        while True:
            code, peak = run_job(request)
            served += 1
            retire = bool(code) or served >= MAX_JOBS_PER_WORKER
            _send(conn, ("exit", code, peak, retire))  # retiring: the server sends it no further job
            if retire:
                break
            try:
                request = _recv(conn)
            except ConnectionError:  # the server retired this worker
                break
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0 if code == 0 else 1)
