"""A job's exact peak resident memory, as the process that reaped it saw it: `<log stem>.rss.json`.

A process cannot measure its own peak to the end: its last log line (`[launch] peak RSS`,
`runner/execute.py`) comes before the interpreter's shutdown, which frees, and sometimes first
allocates (atexit handlers, module teardown), 110-150 MB in the studies measured. The parent that
reaps the job with `os.wait4` gets the kernel's high-water mark of the whole process instead
(`ru_maxrss`, KiB on Linux), shutdown included: the fork server for its children
(`runner/forkserver.py`), the job's client for a job run in its own process (`runner/job_process.py`).
Snakemake's `benchmark:` sampling could miss a short peak (the launcher now writes each job's
benchmark file itself: `store/job_bench.py`).

The client writes the figure beside the job's log once the job process has exited (after the
child wrote its counters, so it is its own small file, written atomically); the report's
efficiency table (`reports/efficiency.py`, the `job_rss` view of `store/results_db.py`) and
`benchmarks/bench_scale.py` read it. No pyarrow here: the client imports this module.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline_src.store.atomic import write_json

RSS_SUFFIX = ".rss.json"


def rss_path(log: str | Path) -> Path:
    """Where a job's peak goes: beside its log, `<log stem>.rss.json`."""
    log = Path(log)
    return log.with_name(log.name.removesuffix(".log") + RSS_SUFFIX)


def maxrss_kib(ru_maxrss: int) -> int:
    """`ru_maxrss` in KiB: Linux reports KiB, macOS bytes."""
    return ru_maxrss // 1024 if sys.platform == "darwin" else int(ru_maxrss)


def clear_job_rss(log: str | Path) -> None:
    """Remove a former run's figure, so a job whose figure cannot be measured shows none, not an old one."""
    rss_path(log).unlink(missing_ok=True)


def write_job_rss(log: str | Path, peak_kib: int, measured_by: str, exit_code: int) -> Path:
    """Write the job's peak beside its log (atomically).

    Args:
        log: the job's log file.
        peak_kib: the job process's `ru_maxrss` from `os.wait4`, in KiB (`maxrss_kib`).
        measured_by: how (e.g. "wait4: fork-server child").
        exit_code: the job's exit status (a failed job's peak is kept too: e.g. one killed for memory).
    """
    path = rss_path(log)
    write_json({"peak_rss_mb": peak_kib / 1024, "peak_rss_kib": int(peak_kib), "measured_by": measured_by,
                "exit_code": int(exit_code)}, path)
    return path


def read_job_rss(path: str | Path) -> dict:
    """One sidecar's fields (`write_job_rss`); ValueError naming the file if it is not one."""
    try:
        row = json.loads(Path(path).read_text())
        return {"peak_rss_mb": float(row["peak_rss_mb"]), "peak_rss_kib": int(row["peak_rss_kib"]),
                "measured_by": str(row["measured_by"]), "exit_code": int(row["exit_code"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a job peak-RSS file ({e})") from e
