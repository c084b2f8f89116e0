"""How a finished study's jobs packed onto the cores: its span, the jobs' CPU, the core-seconds left
idle, the time with a single job running, and each rule's CPU (issue 44 §2).

Each job's benchmark file (`logs/**/<job>.bench.tsv`, `store/job_bench.py`) holds its wall time and
CPU seconds, and is written as the job ends: its mtime is the job's end, that less the wall time its
start. From those: the span (first start to last end), the cores' idle core-seconds (cores x span
less the jobs' CPU), and the seconds with exactly one job running. Beside them, the machine's
one-thread GEMM peak that the study's own report measured at its end (`report/efficiency.csv`):
this project's VMs run the same instructions up to half again slower from one hour to the next, and
the probe says which speed a timing met. Rows go to
<out-dir>/study_timeline.parquet: one for the study (case `study`), one per rule (`rule/<name>`),
times in ms; `--label` names a tree when two are compared (old and new, run back to back).

    python benchmarks/study_timeline.py results/digits-transfer --cores 2 --label new
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_src.store.job_bench import BENCH_SUFFIX, COLUMNS  # noqa: E402


def read_jobs(results: Path) -> list[tuple[float, float, str, float]]:
    """(start, end, rule, CPU s) per job, from the benchmark files under `results/logs`."""
    jobs = []
    for path in sorted((results / "logs").rglob(f"*{BENCH_SUFFIX}")):
        header, row = path.read_text().splitlines()[:2]
        values = dict(zip(header.split("\t"), row.split("\t")))
        if list(values) != list(COLUMNS):
            raise ValueError(f"{path}: not a job benchmark file (columns {list(values)})")
        end, wall = path.stat().st_mtime, float(values["s"])
        cpu = 0.0 if values["cpu_time"] == "NA" else float(values["cpu_time"])
        jobs.append((end - wall, end, path.relative_to(results / "logs").parts[0], cpu))
    if not jobs:
        raise ValueError(f"{results}: no job benchmark files under logs/ (a finished study's results folder?)")
    return jobs


def report_gemm_peak(results: Path) -> float | None:
    """GFLOP/s of the one-thread float32 GEMM probe the study's report ran (None: no report yet, or no
    one-thread rule in it)."""
    import csv

    table = results / "report" / "efficiency.csv"
    if not table.exists():
        return None
    with table.open(newline="") as f:
        peaks = [float(r["peak_gflop_per_s"]) for r in csv.DictReader(f)
                 if r.get("threads") in ("1", "1.0") and r.get("math") == "float32" and r.get("peak_gflop_per_s")]
    return peaks[0] if peaks else None


def packing(jobs: list[tuple[float, float, str, float]], cores: int, step_s: float = 0.05) -> dict:
    """The study's span, CPU, idle core-seconds and single-job seconds (sampled every `step_s`)."""
    t0, t1 = min(j[0] for j in jobs), max(j[1] for j in jobs)
    ticks = np.arange(t0, t1, step_s)
    running = np.zeros(len(ticks), dtype=np.int64)
    for start, end, _, _ in jobs:
        running[(ticks >= start) & (ticks < end)] += 1
    cpu = sum(j[3] for j in jobs)
    return {"span_s": round(t1 - t0, 2), "jobs": len(jobs), "cpu_s": round(cpu, 1),
            "idle_core_s": round(cores * (t1 - t0) - cpu, 1), "one_job_s": round(float((running == 1).sum()) * step_s, 1),
            "packing_pct": round(100 * cpu / (cores * (t1 - t0)), 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="a finished study's results folder, results/<experiment>")
    p.add_argument("--cores", type=int, default=2, help="the cores the study ran on (snakemake --cores)")
    p.add_argument("--label", default="", help="names the tree in the rows' cases, e.g. old or new")
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()
    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows

    jobs = read_jobs(args.results)
    study = packing(jobs, args.cores)
    prefix = f"{args.label}/" if args.label else ""
    common = {"results": str(args.results), "cores": args.cores, "load": list(os.getloadavg())}
    gemm = report_gemm_peak(args.results)
    no_peak = "a study's timeline: job peaks are in the efficiency report"
    rows = [benchmark_row("study_timeline", f"{prefix}study", "cpu", {**common, **study, "gemm_1t_gflop_s": gemm},
                          [study["span_s"] * 1000],
                          None, not_measured=no_peak)]
    per_rule: dict[str, list[float]] = defaultdict(list)
    for _, _, rule, cpu in jobs:
        per_rule[rule].append(cpu)
    print(f"{prefix}study: span {study['span_s']} s, {study['jobs']} jobs, CPU {study['cpu_s']} s, "
          f"idle {study['idle_core_s']} core-s ({study['packing_pct']} % packed), one job running {study['one_job_s']} s"
          + (f"; the report's 1-thread GEMM probe {gemm:.1f} GFLOP/s" if gemm else ""))
    for rule, cpus in sorted(per_rule.items(), key=lambda kv: -sum(kv[1])):
        rows.append(benchmark_row("study_timeline", f"{prefix}rule/{rule}", "cpu",
                                  {**common, "jobs": len(cpus), "cpu_s": round(sum(cpus), 2)},
                                  [c * 1000 for c in cpus], None, not_measured=no_peak))
        print(f"  {rule:28s} {len(cpus):4d} jobs  CPU {sum(cpus):7.1f} s")
    print(write_benchmark_rows("study_timeline", rows, args.out_dir))


if __name__ == "__main__":
    main()
