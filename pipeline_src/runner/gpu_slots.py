"""GPU placement for local runs: one lock file per device, each GPU job holds its devices' locks.

Snakemake does not set `CUDA_VISIBLE_DEVICES` for local jobs: `snakemake --cores 16
--resources gpu=4` only caps how many GPU jobs run at once, and every job would otherwise pick
device 0. A job that declares `gpu=k` takes an exclusive `fcntl.flock` on k of the N slot files
`<lock_dir>/gpu<id>.lock` (N = the devices this machine shows) and runs with
`CUDA_VISIBLE_DEVICES` set to those devices. The kernel drops a lock when its holder exits, so a
crashed or killed job never leaks a slot. Inside a Slurm job (`SLURM_JOB_ID` set) nothing is
done: Slurm's `--gpus` allocation already set the devices.

An existing `CUDA_VISIBLE_DEVICES` (say "2,3") restricts the slots to those devices, and the
job gets entries of that list ("3"), so the lock names stay physical ids shared by all jobs.
`PIPELINE_NUM_GPUS` overrides the device count (tests, or to use fewer devices than present);
`PIPELINE_GPU_LOCK_DIR` the lock directory.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

DEFAULT_LOCK_DIR = Path(tempfile.gettempdir()) / "vitpipe-gpu-slots"


def visible_devices(num_gpus_visible: int | None = None) -> list[str]:
    """Device ids jobs may be given, in the namespace of the caller's CUDA_VISIBLE_DEVICES.

    Args:
        num_gpus_visible: device count to assume; None asks PIPELINE_NUM_GPUS, then the
            CUDA_VISIBLE_DEVICES list, then torch (only if already imported), then nvidia-smi.
    """
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = None if cvd is None else [d.strip() for d in cvd.split(",") if d.strip()]
    if listed is not None and any(d.startswith("-") for d in listed):
        listed = listed[: next(i for i, d in enumerate(listed) if d.startswith("-"))]  # CUDA stops at -1
    if num_gpus_visible is None and os.environ.get("PIPELINE_NUM_GPUS"):
        try:
            num_gpus_visible = int(os.environ["PIPELINE_NUM_GPUS"])
        except ValueError:
            raise ValueError(f"gpu_slots: PIPELINE_NUM_GPUS must be an integer, got "
                             f"{os.environ['PIPELINE_NUM_GPUS']!r}") from None
    if num_gpus_visible is None:
        num_gpus_visible = len(listed) if listed is not None else _count_devices()
    if num_gpus_visible < 0:
        raise ValueError(f"gpu_slots: device count must be >= 0, got {num_gpus_visible}")
    if listed is None:
        return [str(i) for i in range(num_gpus_visible)]
    if num_gpus_visible > len(listed):
        raise ValueError(f"gpu_slots: {num_gpus_visible} devices requested but CUDA_VISIBLE_DEVICES "
                         f"lists only {len(listed)} ({cvd!r})")
    return listed[:num_gpus_visible]


def _count_devices() -> int:
    """Device count without importing torch into a process that has not (imports cost seconds)."""
    if "torch" in sys.modules:
        return int(sys.modules["torch"].cuda.device_count())
    gpus = Path("/proc/driver/nvidia/gpus")  # the driver's list: no nvidia-smi start (0.1-0.5 s) per job
    if gpus.is_dir():
        return sum(1 for _ in gpus.iterdir())
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _slot_file(lock_dir: Path, device: str) -> Path:
    return lock_dir / f"gpu{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}.lock"


def _open_lock_dir(lock_dir: Path) -> None:
    lock_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):  # shared by every user's jobs on the machine
        os.chmod(lock_dir, 0o1777)


def _try_lock(path: Path) -> int | None:
    """Open and exclusively lock a slot file without waiting; the fd, or None if held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    with contextlib.suppress(PermissionError):
        os.fchmod(fd, 0o666)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for humans
    return fd


@contextlib.contextmanager
def acquire_gpu(gpus: int = 1, num_gpus_visible: int | None = None, lock_dir: str | Path | None = None,
                poll_s: float = 0.2, set_environ: bool = True) -> Iterator[list[str] | None]:
    """Hold `gpus` devices for the duration of the block, with CUDA_VISIBLE_DEVICES set to them.

    Waits until enough slots are free; takes all of them at once or none (no deadlock between
    multi-GPU jobs). Restores the previous CUDA_VISIBLE_DEVICES on exit. Yields the device ids,
    or None when nothing was done: `gpus` is 0, the job runs under Slurm, or the machine has no
    GPU (then the job runs on the CPU, as `device: auto` intends).

    Args:
        gpus: devices the job declared (its Snakemake `gpu` resource).
        num_gpus_visible: device count override (default: see `visible_devices`).
        lock_dir: directory of the slot files (default PIPELINE_GPU_LOCK_DIR or
            <tmp>/vitpipe-gpu-slots); must be the same for all jobs of the machine.
        poll_s: seconds between attempts while all slots are busy.
        set_environ: set CUDA_VISIBLE_DEVICES in this process's environment during the block; False
            where jobs of other threads share it (the caller gives the job its own environment).
    """
    if gpus < 0:
        raise ValueError(f"gpu_slots: resource 'gpu' must be >= 0, got {gpus}")
    if gpus == 0 or os.environ.get("SLURM_JOB_ID"):
        yield None
        return
    devices = visible_devices(num_gpus_visible)
    if not devices:
        print(f"gpu_slots: the job asks for {gpus} GPU(s) but none is visible; running without",
              file=sys.stderr)
        yield None
        return
    if gpus > len(devices):
        raise ValueError(f"gpu_slots: the job asks for {gpus} GPUs but only {len(devices)} are visible "
                         f"({','.join(devices)}); lower config key resources.gpu")
    lock_dir = Path(lock_dir or os.environ.get("PIPELINE_GPU_LOCK_DIR") or DEFAULT_LOCK_DIR)
    _open_lock_dir(lock_dir)
    held: dict[str, int] = {}
    try:
        while True:
            for device in devices:
                if len(held) == gpus:
                    break
                fd = _try_lock(_slot_file(lock_dir, device))
                if fd is not None:
                    held[device] = fd
            if len(held) == gpus:
                break
            for fd in held.values():  # all or nothing: let others finish their set
                os.close(fd)
            held.clear()
            time.sleep(poll_s)
        if not set_environ:
            yield list(held)
            return
        previous = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(held)
        try:
            yield list(held)
        finally:
            if previous is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous
    finally:
        for fd in held.values():
            os.close(fd)  # closing the last fd of the file description drops the flock
