"""A job's benchmark file, `<log stem>.bench.tsv`, written by the job's launcher (`runner/launch.py`).

The columns are Snakemake's `benchmark:` format (Snakemake 9, one row), so the `jobs` view
(`store/results_db.py`) and the report's efficiency table (`reports/efficiency.py`) read the
files as before. The rules declare no `benchmark:` any more: a rule's `run:` block runs in a
thread of Snakemake's own process, where Snakemake would sample that whole process tree (its fork
server and every running job) with psutil every second, wrong figures at a cost of 37 CPU-s of
system time over the default study (docs/performance.md). The launcher knows the exact figures:
`s` is the job's wall time from its launch to its reaping, `max_rss` the peak from `os.wait4`
(MB, as Snakemake writes it), `cpu_time` the job process's user + system seconds from the same
`wait4`, `mean_load` their ratio in per cent. What it does not measure is `NA`, as in Snakemake's
own files.
"""
from __future__ import annotations

from pathlib import Path

from pipeline_src.store.atomic import write_text

BENCH_SUFFIX = ".bench.tsv"
COLUMNS = ("s", "h:m:s", "max_rss", "max_vms", "max_uss", "max_pss", "io_in", "io_out", "mean_load", "cpu_time")


def bench_path(log: str | Path) -> Path:
    """Where a job's benchmark goes: beside its log, `<log stem>.bench.tsv`."""
    log = Path(log)
    return log.with_name(log.name.removesuffix(".log") + BENCH_SUFFIX)


def _hms(seconds: float) -> str:
    mm, ss = divmod(int(seconds), 60)
    hh, mm = divmod(mm, 60)
    return f"{hh}:{mm:02d}:{ss:02d}"


def write_job_bench(log: str | Path, wall_s: float, peak_kib: int | None, cpu_s: float | None) -> Path:
    """Write the job's benchmark row beside its log (atomically).

    Args:
        log: the job's log file.
        wall_s: seconds from the job's launch to its reaping.
        peak_kib: the job process's `ru_maxrss` in KiB (None: not measured).
        cpu_s: its user + system CPU seconds (None: not measured).
    """
    na = "NA"
    row = [f"{wall_s:.4f}", _hms(wall_s), na if peak_kib is None else f"{peak_kib / 1024:.2f}", na, na, na, na, na,
           na if cpu_s is None or wall_s <= 0 else f"{100 * cpu_s / wall_s:.2f}", na if cpu_s is None else f"{cpu_s:.2f}"]
    path = bench_path(log)
    write_text("\t".join(COLUMNS) + "\n" + "\t".join(row) + "\n", path)
    return path
