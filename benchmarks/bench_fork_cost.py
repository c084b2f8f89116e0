"""What one job's fork costs the fork server: system time in the server (the fork) and in the
child (its exit), and the child's page faults, for a child that exits at once (`idle`) and one
that runs a tiny forward and backward (`tiny`).

Each setting runs in a fresh process that imports what the fork server preloads
(`forkserver.PRELOAD` and the step modules), then forks `--forks` children one after another,
reading `os.times()` around them and `getrusage(RUSAGE_CHILDREN)` for the children. `--hugetlb`
also runs a process started with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc's heap on
transparent huge pages where the kernel allows them by `madvise`); the settings alternate round
by round, so the machine's drifting speed reaches each alike. Rows go to
<out-dir>/fork_cost.parquet (`store/benchmark_rows.py`): kernel ms per fork (server + child) in
`time_ms_*`, the parts and faults in `sizes`.

    python benchmarks/bench_fork_cost.py --rounds 2 --hugetlb
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def tiny() -> None:
    import torch

    layer = torch.nn.Linear(64, 64)
    layer(torch.randn(32, 64)).sum().backward()


def measure(forks: int) -> dict:
    """In this process: the fork server's preload, then `forks` children per case; per-fork ms."""
    import resource

    from pipeline_src.runner import forkserver

    for module in forkserver.PRELOAD:
        __import__(module)
    forkserver.preload_steps()
    status = {k: v.split()[0] for k, v in (line.split(":", 1) for line in open("/proc/self/status"))
              if k in ("RssAnon", "RssFile", "VmPTE")}
    out = {"kib": {k: int(v) for k, v in status.items()}}
    for case, work in (("idle", lambda: None), ("tiny", tiny)):
        before, kids = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(forks):
            pid = os.fork()
            if pid == 0:
                work()
                os._exit(0)
            os.waitpid(pid, 0)
        after, kids_after = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
        out[case] = {"server_sys_ms": (after.system - before.system) / forks * 1e3,
                     "child_sys_ms": (kids_after.ru_stime - kids.ru_stime) / forks * 1e3,
                     "child_user_ms": (kids_after.ru_utime - kids.ru_utime) / forks * 1e3,
                     "child_faults": (kids_after.ru_minflt - kids.ru_minflt) / forks}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--forks", type=int, default=30, help="children per case and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hugetlb", action="store_true", help="also glibc's heap on transparent huge pages")
    p.add_argument("--out-dir", default="results/benchmarks")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.forks)))
        return

    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows

    settings = {"plain": {}} | ({"hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}} if args.hugetlb else {})
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, env in settings.items():
            proc = subprocess.run([sys.executable, __file__, "--child", "--forks", str(args.forks)], check=True,
                                  capture_output=True, text=True, env={**os.environ, **env})
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    rows = []
    for name, got in runs.items():
        for case in ("idle", "tiny"):
            kernel = [r[case]["server_sys_ms"] + r[case]["child_sys_ms"] for r in got]
            parts = {k: statistics.median(r[case][k] for r in got) for k in got[0][case]}
            print(f"{name:8s} {case:5s} kernel ms per fork: median {statistics.median(kernel):5.1f} "
                  f"(all {', '.join(f'{k:.1f}' for k in kernel)}); " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
            rows.append(benchmark_row("fork_cost", f"{name}/{case}", "cpu",
                                      {"forks": args.forks, **parts, **{f"{k}_kib": v for k, v in got[0]["kib"].items()}},
                                      kernel, None, not_measured="the server's memory is the setting, not a result"))
    print(write_benchmark_rows("fork_cost", rows, args.out_dir))


if __name__ == "__main__":
    main()
