"""Two trees' default studies side by side: a paired measure of what a change saves.

On a machine whose speed drifts (this project's build machines moved by a third within the hour),
back-to-back runs of two trees cannot resolve a few per cent. Here both studies run at the same
time, each `snakemake --cores 1` in a fresh clone of its commit, so each sees the same machine at
the same moment. Each job's CPU comes from its benchmark file (`study_timeline.read_jobs`); rows
go to <out-dir>/study_pair.parquet (`store/benchmark_rows.py`): one per (tree, rule) and one per
tree for the whole study, CPU ms in `time_ms_*`, the study's wall in `sizes`.

    python benchmarks/bench_study_pair.py f83025a HEAD      # old, new: ~5 min on 2 cores

The clones share this checkout's venv (`.venv`, linked) and live in a temporary folder, removed after.
"""
from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from study_timeline import read_jobs  # noqa: E402


def clone(commit: str, where: Path) -> Path:
    """A fresh clone of this repository at `commit`, with this checkout's venv linked in."""
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "-q", commit], check=True)
    (where / ".venv").symlink_to(REPO / ".venv")
    return where


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="the commit before the change")
    p.add_argument("new", help="the commit with it")
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()

    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows

    commits = {label: subprocess.run(["git", "-C", str(REPO), "rev-parse", c], check=True, capture_output=True,
                                     text=True).stdout.strip() for label, c in (("old", args.old), ("new", args.new))}
    rows, cpu = [], {}
    with tempfile.TemporaryDirectory(prefix="study-pair-") as tmp:
        trees = {label: clone(c, Path(tmp) / label) for label, c in commits.items()}
        started = time.monotonic()
        procs = {label: subprocess.Popen([str(d / ".venv/bin/python"), "-m", "snakemake", "--cores", "1"], cwd=d,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                 for label, d in trees.items()}
        walls = {}
        while len(walls) < len(procs):
            for label, proc in procs.items():
                if label not in walls and proc.poll() is not None:
                    if proc.returncode:
                        raise SystemExit(f"{label} ({commits[label][:8]}): snakemake failed ({proc.returncode})")
                    walls[label] = time.monotonic() - started
            time.sleep(0.5)
        for label, d in trees.items():
            by_rule: dict[str, float] = collections.defaultdict(float)
            for _, _, rule, seconds in read_jobs(d / "results" / "digits-transfer"):
                by_rule[rule] += seconds
            cpu[label] = by_rule
            sizes = {"commit": commits[label], "cores": 1, "wall_s": round(walls[label], 1), "side_by_side": True}
            rows.append(benchmark_row("study_pair", f"{label}/study", "cpu", sizes, [1000 * sum(by_rule.values())],
                                      None, not_measured="the jobs' own peaks are in each study's logs"))
            rows += [benchmark_row("study_pair", f"{label}/{rule}", "cpu", sizes, [1000 * s], None,
                                   not_measured="the jobs' own peaks are in each study's logs")
                     for rule, s in sorted(by_rule.items())]
    old, new = cpu["old"], cpu["new"]
    for rule in sorted(set(old) | set(new), key=lambda r: -old.get(r, 0)):
        print(f"{rule:28s} old {old.get(rule, 0):7.1f} s  new {new.get(rule, 0):7.1f} s")
    print(f"{'all jobs':28s} old {sum(old.values()):7.1f} s  new {sum(new.values()):7.1f} s  "
          f"new / old {sum(new.values()) / sum(old.values()):.3f}; wall {walls['old']:.1f} / {walls['new']:.1f} s")
    print(write_benchmark_rows("study_pair", rows, args.out_dir))


if __name__ == "__main__":
    main()
