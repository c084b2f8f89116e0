"""A fork server that removes the per-job start-up cost of local runs.

Importing torch and timm takes seconds, longer than a tiny shard job's training. Locally, the
first job starts one server process (per user, interpreter, package folder and digest of the
package's code, so a job never runs another checkout's or an older version's code) that imports
the heavy libraries once and then forks a fresh child for every job. The child runs the step in
the job's working directory, environment, umask and import path (so a GPU assigned through
`CUDA_VISIBLE_DEVICES` still applies) with stdout/stderr in the job's log, and reports its exit
status back. The server reaps each child with `os.wait4` and sends the client the child's exact peak
RSS (`ru_maxrss`: to its exit, `store/job_rss.py`) after the exit status; the client records it.

The server never starts threads or CUDA before forking. A job's client is a thread of the main
Snakemake process (a rule's `run:` block, `launch.py`). When that process dies (Snakemake killed)
its connections close, and the server kills their jobs' children, so no orphan writes results
behind a rerun, and then exits if no other job runs; otherwise it exits after `IDLE_SECONDS`
without jobs. Set `PIPELINE_FORKSERVER=0` to run every step in a process of its own.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import pickle
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

from pipeline_src.runner.code_digest import code_digest
from pipeline_src.runner.cpu_threads import set_wait_policy
from pipeline_src.runner.job_process import EXECUTE, JobExit, fork_in_own_group, kill_group, reap, resolve
from pipeline_src.runner.job_stops import stopped_by_signals
from pipeline_src.store.atomic import process_umask

IDLE_SECONDS = 120
# opacus: 0.46 CPU-s of every DP job's start before (42 jobs in the default study; docs/performance.md)
# pandas: pyarrow imports it at its first conversion of Python values (every metrics file a job
# writes), 0.15-0.3 CPU-s in each job's child otherwise. Not scikit-learn: the digits are read from
# its CSV (data/images.py), and only the Fashion studies' pixel baseline imports it (issue 44).
PRELOAD = ("numpy", "torch", "timm", "safetensors.torch", "pyarrow.parquet", "pandas", "tqdm.auto", "opacus",
           "jsonschema", "yaml", "scipy.optimize")
# The step modules too (all but the report's, one job that imports matplotlib): 0.06-0.12 CPU-s of
# imports in each job's child before, 0.17 s once here (docs/performance.md).
PRELOAD_STEPS = True  # False: a test's server that preloads numpy only
UNPRELOADED_STEPS = ("pipeline_src.steps.report",)
_HEADER = struct.Struct("!Q")
PACKAGE = Path(__file__).resolve().parent.parent  # pipeline_src (this file: pipeline_src/runner/forkserver.py)
_DONE = b"\x01"  # client -> server after it received the exit status; EOF without it: the client died


def socket_path() -> Path:
    """One server per user, Python interpreter, package folder and version of its code."""
    package = PACKAGE  # the whole pipeline_src, not only runner/
    key = f"{sys.executable}|{package}|{code_digest(package)}|{os.getuid()}"
    return socket_in_tmp(f"vitpipe-{hashlib.sha1(key.encode()).hexdigest()[:12]}.sock")


SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path is 108 with its NUL on Linux)


def socket_in_tmp(name: str) -> Path:
    """`name` in the temporary folder (TMPDIR), or, where that path is too long for a Unix socket
    (a deep TMPDIR: binding would fail and every job would silently run without its server), in
    `/tmp/vitpipe-<uid>/`, made owner-only and refused unless it is this user's own 0700 folder.

    Raises:
        PermissionError: the short folder exists but is another user's or not owner-only.
    """
    path = Path(tempfile.gettempdir()) / name
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return path
    short = Path("/tmp") / f"vitpipe-{os.getuid()}"
    short.mkdir(mode=0o700, exist_ok=True)
    st = short.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(f"{short} must be a folder of user {os.getuid()} with mode 0700 (it holds job server sockets)")
    return short / name


def _send(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv(sock: socket.socket):
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("fork server closed the connection")
            buf += chunk
        return buf

    (n,) = _HEADER.unpack(exact(_HEADER.size))
    return pickle.loads(exact(n))


# ----------------------------------------------------------------------------- server
def preload_steps() -> list[str]:
    """Import the step modules (`pipeline_src.steps.*`) but UNPRELOADED_STEPS; returns their names."""
    import pkgutil

    steps = importlib.import_module("pipeline_src.steps")  # as `execute` imports a step: by name
    names = [m.name for m in pkgutil.walk_packages(steps.__path__, f"{steps.__name__}.")
             if m.name not in UNPRELOADED_STEPS]
    for name in names:
        importlib.import_module(name)
    return names


def listen_at(path: Path) -> socket.socket:
    """Preload the job modules, then listen at `path` (owner-only), which appears atomically once
    the server is ready to accept; the fork server and the GPU job server start the same way."""
    set_wait_policy()  # before torch loads libgomp, which reads it once (cpu_threads.py)
    for mod in PRELOAD:
        __import__(mod)
    if PRELOAD_STEPS:
        preload_steps()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_suffix(f".{os.getpid()}")
    server.bind(str(tmp))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)  # appear atomically, ready to accept
    server.listen(64)
    return server


def serve(path: Path, lock_fd: int | None = None) -> None:
    server = listen_at(path)
    if lock_fd is not None:  # a background start (`prestart`): its starters wait on this lock until now
        os.close(lock_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    last = time.monotonic()
    jobs: dict[int, socket.socket] = {}  # child pid -> its client's connection
    try:
        while True:
            ready, _, _ = select.select([server, *jobs.values()], [], [], 1.0)
            died = 0
            for pid in list(jobs):  # reap finished children; closing tells a client whose child died
                done = reap(pid, block=False)
                if done is not None:
                    died += _client_gone(jobs.pop(pid), done)
            for pid in [pid for pid, conn in jobs.items() if conn in ready]:
                conn = jobs.pop(pid)
                try:
                    got = conn.recv(1)
                except OSError:  # reset: the client died with the exit status unread
                    got = b""
                if got == _DONE:  # the client got its exit status; the child is exiting
                    _send_peak(conn, reap(pid))
                else:  # EOF: the client died (Snakemake killed); stop its job before a rerun starts
                    if reap(pid, block=False) is None:
                        kill_group(pid)
                        reap(pid)
                    died += 1
                conn.close()
            if died and not jobs:
                break
            if server in ready:
                conn, _ = server.accept()
                try:
                    conn.settimeout(10.0)
                    request = _recv(conn)
                    conn.settimeout(None)
                except (OSError, ConnectionError):  # the client died while asking: the run was killed
                    conn.close()
                    if not jobs:
                        break
                    continue
                pid = fork_in_own_group()  # killable at once: its client may be gone already
                if pid == 0:
                    server.close()
                    for other in jobs.values():  # so a client sees EOF as soon as its own child dies
                        other.close()
                    _child(conn, request)  # never returns
                jobs[pid] = conn
                last = time.monotonic()
            elif not jobs and time.monotonic() - last > IDLE_SECONDS:
                break
    finally:
        if path.exists():
            path.unlink()


def _send_peak(conn: socket.socket, done: JobExit) -> None:
    """Send the reaped child's wait status, peak RSS and CPU seconds to its client:
    `("exit", code, KiB, cpu_s)`. The
    client waits for it after `_DONE`, or gets it instead of the child's exit status if the child
    died without reporting one (e.g. killed for memory)."""
    try:
        conn.settimeout(5.0)
        _send(conn, ("exit", done.code, done.peak_kib, done.cpu_s))
    except OSError:  # the client died meanwhile: nobody to tell
        pass


def _client_gone(conn: socket.socket, done: JobExit) -> int:
    """Close the connection of a job that ended by itself, after sending its client the child's
    peak; 1 if its client had died meanwhile (EOF without `_DONE`: a killed run), else 0."""
    try:
        conn.setblocking(False)
        got = conn.recv(1)
    except BlockingIOError:  # the client is alive, still reading the exit status
        got = _DONE
    except OSError:  # reset
        got = b""
    if got == _DONE:  # queued after the child's exit status, if the child sent one before exiting
        _send_peak(conn, done)
    conn.close()
    return int(got != _DONE)


def _child(conn: socket.socket, request: dict) -> None:
    code = 1
    try:
        _send(conn, os.getpid())  # its process group's id too (`fork_in_own_group`)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        set_wait_policy()  # what the server's libgomp runs with, for the processes the job starts
        os.umask(request["umask"])
        # The job's import path first, in its order: its own workflow's package wins.
        sys.path[:] = request["sys_path"] + [p for p in sys.path if p not in request["sys_path"]]
        code = int(resolve(request["call"])(request["step"], request["args"]) or 0)
    except BaseException:  # report anything, including SystemExit from a step
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush(), sys.stderr.flush()
            _send(conn, code)
        finally:
            os._exit(code)


# ----------------------------------------------------------------------------- client
def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _ensure_server(path: Path, wait_s: float = 30.0,
                   module: str = "pipeline_src.runner.forkserver") -> socket.socket | None:
    """Connect to the server listening at `path`, starting `python -m <module> <path>` first if
    none does (one starter at a time); None if none answers within `wait_s`."""
    sock = _connect(path)
    if sock:
        return sock
    with open(str(path) + ".lock", "w") as lock:
        deadline = time.monotonic() + wait_s
        while True:  # one starter at a time; a server being started (`prestart`) holds it until it listens
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                sock = _connect(path)
                if sock or time.monotonic() > deadline:
                    return sock
                time.sleep(0.05)
        sock = _start_unless_listening(path, module)
        if sock:
            return sock
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock:
                return sock
            time.sleep(0.05)
    return None


def run_in_server(step: str, args, on_child: Callable[[int], None] | None = None, *, call: str = EXECUTE,
                  path: Path | None = None, env: dict[str, str] | None = None) -> JobExit | None:
    """Run a step in a forked child of the server; None when no server could be reached.

    Args:
        step: the step module's name.
        args: the job's StepArgs.
        on_child: called with the child's pid (its process group) once it runs.
        call: `module:function` the child runs as `call(step, args)` (a test's probe; jobs run `EXECUTE`).
        path: the server's socket (default: `socket_path()`, started if missing).
        env: the child's environment (default: this process's).
    Returns:
        The child's exit status and peak RSS (None where the server could not send it).
    """
    sock = _ensure_server(path or socket_path())
    if sock is None:
        return None
    with sock:
        umask = process_umask()
        _send(sock, {"call": call, "step": step, "args": args, "cwd": os.getcwd(),
                     "env": dict(os.environ) if env is None else env, "sys_path": sys.path, "umask": umask})
        child = _recv(sock)
        if on_child is not None:
            on_child(child)
        with stopped_by_signals(lambda signum: os.killpg(child, signum)):  # Snakemake cancelling the job stops the child too
            try:
                got = _recv(sock)
            except ConnectionError:
                return JobExit(1, None)
            if isinstance(got, tuple):  # died without reporting (e.g. killed for memory): the server's word
                return JobExit(int(got[1]) or 1, got[2], got[3])
            try:
                sock.sendall(_DONE)
            except OSError:  # the child exited first: the server sent its peak already and closed
                pass
            try:
                sock.settimeout(60.0)  # the server reaps the child (it is exiting), then sends its peak
                _, _, peak, cpu = _recv(sock)
            except (OSError, ConnectionError, ValueError, TypeError):
                peak = cpu = None
            return JobExit(int(got), peak, cpu)


def prestart(path: Path | None = None, module: str = "pipeline_src.runner.forkserver") -> bool:
    """Start the server in the background without waiting for it (a run's start, while Snakemake
    builds its DAG: the imports, seconds, overlap that instead of delaying the first job). The new
    server holds the start lock until it listens, so a job that asks meanwhile (`_ensure_server`)
    waits for it instead of starting another. False when one answers or is being started already.

    Args:
        path: the server's socket (default: `socket_path()`).
        module: the server's module (`python -m <module> <path> <lock fd>`; a test's lighter one).
    """
    path = path or socket_path()
    sock = _connect(path)
    if sock:
        sock.close()
        return False
    with open(str(path) + ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another starter is at it
            return False
        sock = _start_unless_listening(path, module, lock_fd=lock.fileno())
    if sock:
        sock.close()
        return False
    return True  # our copy of the lock is closed; the server's keeps it until it listens


def _start_unless_listening(path: Path, module: str, lock_fd: int | None = None) -> socket.socket | None:
    """With the start lock held: a connection to a server that listens by now, else None after
    starting one (`python -m <module> <path> [lock fd]`, detached: its own session, quiet)."""
    sock = _connect(path)
    if sock:
        return sock
    if path.exists():
        path.unlink()  # stale socket of a dead server
    # cwd: `-m` puts it first on the path, so the server imports this very package, not the job folder's
    subprocess.Popen([sys.executable, "-m", module, str(path), *([str(lock_fd)] if lock_fd is not None else [])],
                     start_new_session=True, cwd=PACKAGE.parent, pass_fds=(lock_fd,) if lock_fd is not None else (),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return None


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
