"""One run of a study at a time, whatever the other studies of the clone do (docs/reliability.md).

Snakemake's lock is per working folder, not per study: its lock files (`.snakemake/locks/`) list
the files a run reads and writes, and every run that ends, and every `--unlock`, deletes the whole
folder, the locks of another study's run included. A second run of that study then went through
while the first ran (issue 44). So the main Snakemake process of a run that executes (not a dry
run, `--lint`, `--unlock` or `--nolock`) also takes a lock of the pipeline's own, one per study:
a POSIX record lock (`fcntl.lockf`, which NFS supports too) on
`.snakemake/study_locks/<experiment>.lock`, taken before Snakemake builds the DAG and held until
the process ends. The kernel drops it when the process dies, even by SIGKILL, so it never goes
stale and no `--unlock` is needed for it, nor can one remove it. The file names the holder (its
pid, host and start time) for the message that refuses a second run.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

LOCKS = "study_locks"  # under Snakemake's folder, which Snakemake never deletes
_held: dict[str, int] = {}  # experiment -> the open descriptor that holds its lock (this process)


class StudyRunning(RuntimeError):
    """Another process runs the study."""


def lock_path(experiment: str, snakemake_dir: str | Path = ".snakemake") -> Path:
    """The lock file of a study.

    Args:
        experiment: the study's name (a validated folder name).
        snakemake_dir: Snakemake's folder in the working directory.
    """
    return Path(snakemake_dir) / LOCKS / f"{experiment}.lock"


def _running_message(experiment: str, holder: str) -> str:
    return (f"study '{experiment}' is running already in this folder ({holder or 'another process'}): nothing was "
            "run. Let it finish or stop it (docs/reliability.md); its lock ends with that process, so --unlock "
            "neither needs to nor can remove it. Other studies of this folder may run beside it.")


def lock_study(experiment: str, snakemake_dir: str | Path = ".snakemake") -> None:
    """Take the study's lock for the rest of this process's life.

    Args:
        experiment: the study's name.
        snakemake_dir: Snakemake's folder in the working directory.
    Raises:
        StudyRunning: another process holds it, naming that process.
    """
    if experiment in _held:
        return
    path = lock_path(experiment, snakemake_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # the umask applies (0600 in a DP study)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
        os.close(fd)
        if e.errno in (errno.EACCES, errno.EAGAIN):
            raise StudyRunning(_running_message(experiment, holder)) from None
        raise
    os.ftruncate(fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    os.pwrite(fd, f"Snakemake pid {os.getpid()} on {socket.gethostname()}, since {started}\n".encode(), 0)
    _held[experiment] = fd  # never closed: closing any descriptor of the file would drop the lock


def running_holder(experiment: str, snakemake_dir: str | Path = ".snakemake") -> str | None:
    """Who runs the study now (the lock file's line), or None when no other process holds its lock.

    Args:
        experiment: the study's name.
        snakemake_dir: Snakemake's folder in the working directory.
    """
    path = lock_path(experiment, snakemake_dir)
    if experiment in _held or not path.is_file():
        return None  # a probe of our own lock would drop it (POSIX locks are per process)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        return os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)  # also drops the probe's lock
    return None


def refuse_unlock_while_running(experiment: str, snakemake_dir: str | Path = ".snakemake") -> None:
    """Refuse `--unlock` of a study that is running: the lock it would remove is not stale.

    Raises:
        StudyRunning: naming the running process.
    """
    holder = running_holder(experiment, snakemake_dir)
    if holder:
        raise StudyRunning(f"study '{experiment}' is running in this folder ({holder}): nothing was unlocked. "
                           "--unlock is for the lock a killed run left behind; let the run finish or stop it "
                           "(docs/reliability.md).")
