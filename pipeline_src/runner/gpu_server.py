"""The GPU job server: jobs run in long-lived worker processes that hold their device's CUDA context.

A job's fixed cost on a GPU was its process: importing torch and opening a CUDA context took
about 4 s per job on an H200, longer than training a 28-px shard model. The CPU fork server
(`forkserver.py`) removes the import, but a forked child still opens its own context, and a
process that opened one cannot fork. So GPU jobs go to this server instead: one per user,
interpreter, package folder, code digest (and Slurm allocation), started by the first GPU job
and left after `IDLE_SECONDS` without jobs. It imports the heavy libraries, never touches CUDA,
and forks workers (`gpu_worker.py`): each opens the context of the devices its first job was
given (`CUDA_VISIBLE_DEVICES`, set by `gpu_slots.py`, and the MPS variables) and then runs jobs
with those same values one at a time. A job gets an idle worker of its devices, or a new one
when all are busy: as many workers per device as jobs run there at once (several under MPS).

Snakemake's side does not change: each job is still a process of Snakemake's (the thin client,
`launch.py`, which imports no torch) that waits for its job, and its outputs, log, peak RSS
(`store/job_rss.py`, measured in the worker) and benchmark file are its own. The benchmark file
times the job's wall clock; its memory and CPU figures are the client's, as with the fork server.

When a client dies before its job ends (Snakemake cancelled the job, or its run was killed and the
orphan guard stopped the client) the server SIGKILLs that job's worker with its process group
(data loader processes included) and serves on; a new worker replaces it when needed. The job's
outputs are written atomically (`store/atomic.py`), so a killed job leaves none half-written.

`PIPELINE_GPU_SERVER` chooses: `auto` (default) serves the jobs that run a model on a GPU: a
`device: cuda` job, or a `device: auto` job that holds GPU slots or sees an NVIDIA GPU, outside
Slurm jobs; `1` serves every job that runs a model, on whatever device (the tests, on the CPU,
and grouped Slurm jobs: one server per allocation); `0` never (each job opens its own context).
"""
from __future__ import annotations

import hashlib
import os
import select
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pipeline_src.runner.code_digest import code_digest
from pipeline_src.runner.forkserver import PACKAGE, _ensure_server, _recv, _send, listen_at, socket_in_tmp
from pipeline_src.runner.job_process import EXECUTE, JobExit, fork_in_own_group, kill_group, reap
from pipeline_src.runner.job_stops import stopped_by_signals
from pipeline_src.store.atomic import process_umask

IDLE_SECONDS = 120
START_WAIT_S = 120.0  # how long a job waits for the server it started before running in its own process
MODE_ENV = "PIPELINE_GPU_SERVER"
# Steps that run a model on the job's device (`runtime.resolve_device`): the ones worth a warm context.
# (tests/runner/test_gpu_server.py checks the list against the step modules' sources)
DEVICE_STEPS = frozenset({"pretrain", "features", "train", "train_vectorized", "evaluate", "last_grid", "ablation",
                          "baseline_small_cnn",
                          "fusion.train", "fusion.match", "fusion.fuse", "privacy.train", "privacy.evaluate",
                          "forget.drop", "forget.retrain", "forget.paragon"})


def socket_path() -> Path:
    """One server per user, interpreter, package folder, version of its code and Slurm allocation."""
    key = (f"gpu|{sys.executable}|{PACKAGE}|{code_digest(PACKAGE)}|{os.getuid()}|"
           f"{os.environ.get('SLURM_JOB_ID', '')}")
    return socket_in_tmp(f"vitpipe-gpu-{hashlib.sha1(key.encode()).hexdigest()[:12]}.sock")


def nvidia_gpu_present() -> bool:
    """Whether the NVIDIA driver lists a GPU and CUDA_VISIBLE_DEVICES hides none of them all
    (no subprocess, no torch: the client decides in microseconds)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-")):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def wants_gpu_server(step: str, device: str | None, holds_gpu: bool) -> bool:
    """Whether a job runs in the GPU job server (see the module's docstring for `PIPELINE_GPU_SERVER`).

    Args:
        step: the job's step module (`pipeline_src.steps.<step>`).
        device: its `device` setting (`cpu`, `cuda`, `auto`; None: the step has none).
        holds_gpu: the launcher gave it GPU slots (`gpu_slots.acquire_gpu`).
    """
    mode = os.environ.get(MODE_ENV, "auto")
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"{MODE_ENV} must be auto, 0 or 1, got {mode!r}")
    if mode == "0" or step not in DEVICE_STEPS or device is None:
        return False
    if mode == "1":
        return True
    if os.environ.get("SLURM_JOB_ID"):  # one job per allocation: the server would serve one job
        return False
    return device == "cuda" or (device == "auto" and (holds_gpu or nvidia_gpu_present()))


# ----------------------------------------------------------------------------- server
@dataclass
class Worker:
    """A worker process, the server's end of its socket pair, and the client whose job it runs."""

    pid: int
    conn: socket.socket
    key: tuple
    client: socket.socket | None = None
    retiring: bool = False  # it said it exits after its job (a failure, or its job count)
    idle_since: float = field(default_factory=time.monotonic)


def _fork_worker(server: socket.socket, workers: list[Worker], request: dict) -> Worker:
    """Fork a worker for `request` (its first job) and return it."""
    from pipeline_src.runner.gpu_worker import worker_key, worker_main

    ours, theirs = socket.socketpair()
    pid = fork_in_own_group()  # the server may kill it the moment it exists (a client gone at once)
    if pid == 0:
        server.close()
        ours.close()
        for w in workers:  # a client sees EOF as soon as its worker dies, not when all do
            w.conn.close()
            if w.client is not None:
                w.client.close()
        worker_main(theirs, request)  # never returns
    theirs.close()
    return Worker(pid, ours, worker_key(request["env"]))


def _tell(client: socket.socket | None, message: tuple) -> None:
    """Send a client its job's end and close it (it may be gone: nobody to tell then)."""
    if client is None:
        return
    try:
        client.settimeout(5.0)
        _send(client, message)
    except OSError:
        pass
    client.close()


def _drop(worker: Worker, workers: list[Worker], kill: bool) -> JobExit:
    """Remove a worker: SIGKILL its process group first if `kill`; reap it."""
    if kill:
        kill_group(worker.pid)
    worker.conn.close()
    workers.remove(worker)
    return reap(worker.pid)


def serve(path: Path) -> None:
    """Accept jobs at `path` and run each in a worker of its devices until idle for `IDLE_SECONDS`."""
    import pipeline_src.runner.execute  # noqa: F401 (what every job runs first)
    from pipeline_src.runner.gpu_worker import worker_key

    server = listen_at(path)
    last = time.monotonic()
    workers: list[Worker] = []
    try:
        while True:
            clients = [w.client for w in workers if w.client is not None]
            ready, _, _ = select.select([server, *[w.conn for w in workers], *clients], [], [], 1.0)
            now = time.monotonic()
            for w in [w for w in workers if w.conn in ready]:  # a job ended, or its worker died
                try:
                    message = _recv(w.conn)
                except (ConnectionError, OSError):  # died (killed for memory, or retired after a failure)
                    done = _drop(w, workers, kill=False)
                    _tell(w.client, ("exit", done.code or (1 if w.client else 0), done.peak_kib))
                    continue
                _tell(w.client, message[:3])
                w.client, w.idle_since, w.retiring, last = None, now, message[3], now
            for w in [w for w in workers if w.client is not None and w.client in ready]:
                # a client says nothing after its request: readable means EOF, it died mid-job
                w.client.close()
                w.client = None
                _drop(w, workers, kill=True)
            for w in [w for w in workers if w.client is None and not w.retiring and now - w.idle_since > IDLE_SECONDS]:
                _drop(w, workers, kill=False)  # EOF on its pipe: it exits
            if server in ready:
                conn, _ = server.accept()
                try:
                    conn.settimeout(10.0)
                    request = _recv(conn)
                    conn.settimeout(None)
                except (OSError, ConnectionError):  # the client died while asking
                    conn.close()
                    continue
                key = worker_key(request["env"])
                idle = [w for w in workers if w.client is None and not w.retiring and w.key == key]
                if idle:
                    worker = idle[0]
                    try:
                        _send(worker.conn, request)
                    except OSError:  # it retired meanwhile: a fresh one
                        _drop(worker, workers, kill=True)
                        worker = _fork_worker(server, workers, request)
                        workers.append(worker)
                else:
                    worker = _fork_worker(server, workers, request)
                    workers.append(worker)
                worker.client = conn
                try:
                    _send(conn, worker.pid)
                except OSError:
                    pass  # its EOF is seen next round: the worker is stopped then
                last = now
            elif not workers and now - last > IDLE_SECONDS:
                break
    finally:
        for w in list(workers):
            _drop(w, workers, kill=True)
        if path.exists():
            path.unlink()


# ----------------------------------------------------------------------------- client
def run_in_gpu_server(step: str, args, on_worker: Callable[[int], None] | None = None, *, call: str = EXECUTE,
                      path: Path | None = None, env: dict[str, str] | None = None) -> JobExit | None:
    """Run a step in a worker of the GPU job server; None when no server could be reached.

    Args:
        step: the step module's name.
        args: the job's StepArgs.
        on_worker: called with the worker's pid once the job was given to it (for the record: to
            stop the job, this process dies or is signalled, and the server stops the worker).
        call: `module:function` the worker runs as `call(step, args)` (a test's probe; jobs run `EXECUTE`).
        path: the server's socket (default: `socket_path()`, started if missing).
        env: the job's environment (default: this process's).
    Returns:
        The job's exit status and peak RSS (its worker's high-water mark during the job).
    """
    # Waiting for a starting server is never slower than the fallback, a process that imports the same
    # libraries: 120 s, not the fork server's 30 (a loaded machine took longer than 30 s to import them).
    sock = _ensure_server(path or socket_path(), wait_s=START_WAIT_S, module="pipeline_src.runner.gpu_server")
    if sock is None:
        return None
    with sock:
        umask = process_umask()
        # Snakemake cancelling the job: closing the connection stops its worker
        with stopped_by_signals(lambda _signum: sock.shutdown(socket.SHUT_RDWR)):
            _send(sock, {"call": call, "step": step, "args": args, "cwd": os.getcwd(),
                         "env": dict(os.environ) if env is None else env, "sys_path": sys.path, "umask": umask})
            try:
                worker = _recv(sock)
                if on_worker is not None:
                    on_worker(worker)
                _, code, peak = _recv(sock)
            except (ConnectionError, OSError):  # the server died, or the job was stopped
                return JobExit(1, None)
            return JobExit(int(code), peak)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
