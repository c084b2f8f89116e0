"""CPU seconds of a cold dry run per study (issue 44: default ≤ 2 s, Fashion ≤ 5 s).

Each repeat runs `python -m snakemake -n -q rules -s <repo>/Snakefile --configfile <study>` in a
fresh empty folder (no `.snakemake/`, no `results/`, so no plan cache: what a first dry run pays)
and reads the child's user + system CPU seconds and peak RSS from `os.wait4`. CPU seconds, not wall:
on a shared machine the wall clock measures the others' load. The job count comes from the run's
own job table, so a row also says that the plan did not change. `--python` runs the dry runs with
other interpreters (venvs with and without the Slurm executor plugin, say), their repeats
interleaved; each row names whether its interpreter has the plugin. Rows go to <out-dir>/dry_run.parquet
(`store/benchmark_rows.py`), the CPU milliseconds in `time_ms_*`, the wall in `sizes`.

Each repeat also dry-runs a one-rule Snakefile with the same interpreter (case `floor`): what
Snakemake's start costs any workflow (its imports, CLI and plugin registries). Interleaved with the
studies' runs, it moves with the machine's speed as they do, so "over the floor" (the study's median
minus the floor's) is the part this workflow adds, comparable across moments and machines.

`--instructions` also runs each case once under valgrind's cachegrind (`--cache-sim=no`, ~20x
slower) and records the instructions it executed (`sizes.instructions`, `PYTHONHASHSEED=0`): a count
that does not move with the machine's speed, for A/B comparisons on a machine whose CPU seconds
drift by a third within the hour. It counts work, not time: a full collection's cache misses, say,
cost more time than their instructions say.

`--finished STUDY=DIR` times, besides, the dry run of a finished study in its working directory DIR
("Nothing to be done": every output's mtime and metadata checked, what a user sees before and after
a run); that row's `sizes.cold` is false, and its job count 0.

    python benchmarks/bench_dry_run.py                         # both studies, 5 repeats each
    python benchmarks/bench_dry_run.py --study default --finished default=~/clone   # and the finished study in ~/clone
    python benchmarks/bench_dry_run.py --study default --repeats 9 --python with=.venv/bin/python --python without=/other/bin/python
    python benchmarks/bench_dry_run.py --study default --repeats 3 --instructions   # and each case's instruction count
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STUDIES = {"default": "config.yaml", "fashion": "studies/fashion_mnist.yaml", "fashion_near": "studies/fashion_near.yaml"}
_TOTAL = re.compile(r"^total\s+(\d+)\s*$", re.M)


ONE_RULE = 'rule one:\n    output:\n        "one.txt",\n    shell:\n        "touch {output}"\n'


CACHEGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
_I_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instruction_count(valgrind_output: str) -> int:
    """The instructions cachegrind counted ("I refs"), from its summary."""
    found = _I_REFS.search(valgrind_output)
    if not found:
        raise RuntimeError(f"no cachegrind summary in the output:\n{valgrind_output[-3000:]}")
    return int(found.group(1).replace(",", ""))


def dry_run(python: str, configfile: str | None, finished: Path | None = None,
            count_instructions: bool = False) -> tuple[float, float, float, int, int | None]:
    """One dry run: (CPU s, wall s, peak RSS MB, jobs planned, instructions or None).

    Args:
        python: the interpreter that runs Snakemake.
        configfile: the study file, relative to the repository; None: the one-rule Snakefile (the floor).
        finished: a finished study's working directory, to dry-run in (it must plan nothing);
            None: a fresh empty folder (cold).
        count_instructions: run it under cachegrind and count its instructions (its times are then
            valgrind's, not the dry run's).
    """
    with tempfile.TemporaryDirectory(prefix="dry-run-") as folder:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        if configfile is None:
            (Path(folder) / "Snakefile").write_text(ONE_RULE)
            workflow = ["-s", str(Path(folder) / "Snakefile")]
        else:
            workflow = ["-s", str(REPO / "Snakefile"), "--configfile", str(REPO / configfile)]
        cmd = [python, "-m", "snakemake", "-n", "-q", "rules", *workflow]
        if count_instructions:
            cmd, env = CACHEGRIND + cmd, {**env, "PYTHONHASHSEED": "0"}  # the same dict and set orders each run
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=finished or folder, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
    instructions = instruction_count(out) if count_instructions else None
    if finished is not None:
        if "Nothing to be done" not in out:
            raise RuntimeError(f"{finished}: not a finished study, the dry run plans jobs:\n{out[-3000:]}")
        return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024, 0, instructions
    jobs = _TOTAL.search(out)
    if not jobs:
        raise RuntimeError(f"no job table in the dry run's output:\n{out[-3000:]}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024, int(jobs.group(1)), instructions


def has_module(python: str, name: str) -> bool:
    """Whether `python` can import the top-level module `name` (found, not imported)."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", action="append", choices=sorted(STUDIES), help="repeatable (default: default, fashion)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--python", action="append", metavar="[LABEL=]PATH",
                   help="an interpreter that runs Snakemake, repeatable: the repeats alternate between them, so "
                        "the machine's load varies alike (default: this one)")
    p.add_argument("--finished", action="append", default=[], metavar="STUDY=DIR",
                   help="also dry-run the finished study STUDY in its working directory DIR, repeatable")
    p.add_argument("--instructions", action="store_true",
                   help="also count each case's instructions once, under valgrind's cachegrind (~20x slower)")
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        p.error("--instructions needs valgrind on PATH (Debian: apt install valgrind)")
    finished = {}
    for item in args.finished:
        study, _, folder = item.partition("=")
        if study not in STUDIES or not Path(folder).expanduser().is_dir():
            p.error(f"--finished {item}: STUDY is one of {sorted(STUDIES)}, DIR a study's working directory")
        finished[study] = Path(folder).expanduser().resolve()
    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows

    pythons = dict(x.split("=", 1) if "=" in x else ("", x) for x in args.python or [sys.executable])
    rows = []
    cases = [("floor", None)] + [(study, None) for study in args.study or ["default", "fashion"]] + list(finished.items())
    runs: dict[tuple, list[tuple]] = {}
    for _ in range(args.repeats):  # every case once per repeat: the machine's drift reaches all alike
        for study, folder in cases:
            for label, python in pythons.items():
                runs.setdefault((study, folder, label), []).append(dry_run(python, STUDIES.get(study), folder))
    counted = {(study, folder, label): dry_run(python, STUDIES.get(study), folder, count_instructions=True)[4]
               for study, folder in cases for label, python in pythons.items()} if args.instructions else {}
    floor = {label: statistics.median(c for c, *_ in runs[("floor", None, label)]) for label in pythons}
    for (study, folder, label), measured in runs.items():
        python = pythons[label]
        cpu, wall, rss, jobs, _ = (list(x) for x in zip(*measured))
        if len(set(jobs)) != 1:
            raise RuntimeError(f"{study}: the dry runs planned different job counts: {jobs}")
        slurm_plugin = has_module(python, "snakemake_executor_plugin_slurm")
        sizes = {"study": STUDIES.get(study) or "one-rule Snakefile", "jobs": jobs[0],
                 "slurm_plugin_installed": slurm_plugin, "python": python,
                 "clock": "user+sys CPU of the snakemake process (os.wait4)", "cold": folder is None,
                 "wall_ms_median": round(statistics.median(wall) * 1000, 1),
                 "floor_ms_median": round(floor[label] * 1000, 1)}
        instructions = ""
        if counted:
            sizes["instructions"] = counted[(study, folder, label)]
            sizes["floor_instructions"] = counted[("floor", None, label)]
            instructions = f", {sizes['instructions'] / 1e9:.2f} G instructions"
            if study != "floor":
                instructions += f" ({(sizes['instructions'] - sizes['floor_instructions']) / 1e9:.2f} G over the floor)"
        case = study + ("" if folder is None else "/finished") + (f"/{label}" if label else "")
        rows.append(benchmark_row("dry_run", case, "cpu", sizes, [c * 1000 for c in cpu], max(rss),
                                  method="ru_maxrss of the dry-run process (os.wait4)"))
        over = "" if study == "floor" else f", over the floor {statistics.median(cpu) - floor[label]:5.2f} s"
        print(f"{case:24s} {jobs[0]:5d} jobs  CPU median {statistics.median(cpu):5.2f} s{over} "
              f"(all: {', '.join(f'{c:.2f}' for c in cpu)}), wall median {statistics.median(wall):5.2f} s, "
              f"peak RSS {max(rss):.0f} MB, Slurm plugin {'installed' if slurm_plugin else 'absent'}{instructions}",
              flush=True)
    print(write_benchmark_rows("dry_run", rows, args.out_dir))


if __name__ == "__main__":
    main()
