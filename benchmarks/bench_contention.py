"""A 2-thread training epoch idle and beside k busy processes (issue 44, section 3).

A job's epoch on a shared machine should slow down by about its CPU share, no more. The epoch is
the near study's `pretrain` (`studies/fashion_near.yaml`'s backbone: 28 px, patch 7, D 96,
depth 4, 4 heads, MLP ratio 2; batch 128) through `methods/training.fit` on random images, run as
a job runs it: in a fresh process whose OpenMP wait policy is set before torch is imported
(`runner/cpu_threads.set_wait_policy`, as the fork server and a job's own process do), and with
`set_up_job(threads)`. Each case's process runs one warm-up epoch, then `--repeats` timed epochs,
while k processes spin on the CPU (a Python loop, one thread each, started before the job and
stopped after it; each stops by itself if this script dies).

Policies (each a fresh job process):
  spin     libgomp's default wait (OMP_WAIT_POLICY and GOMP_SPINCOUNT removed): the jobs before issue 44;
  runner   what jobs get now (`cpu_threads.WAIT_POLICY`, unless the user set those variables);
  one      the runner's policy with a single intra-op thread;
  passive  OMP_WAIT_POLICY=PASSIVE: waiting threads sleep at once;
  spincount=N   GOMP_SPINCOUNT=N: they spin N times, then sleep (libgomp's default: 300,000).

Rows go to results/benchmarks/contention.parquet: case `<policy>:k=<k>`, the epoch times (ms),
sizes with the images, threads, k, the machine's CPUs, the load average before the case, the
slowdown against the same policy's idle epoch (`slowdown`) and against the spin policy's
(`vs_spin_idle`, when measured), and the CPU-share bound it should
track (`share_bound`: (threads + k) / CPUs when that exceeds 1, for a job whose threads all run).
The machine must be otherwise idle for the figures to mean anything: the row records the load.

    python benchmarks/bench_contention.py [--busy 0 2 4] [--policies spin runner one] [--images 2048] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline_src.runner.cpu_threads import USER_WAIT, set_wait_policy  # noqa: E402  (no torch)

ARCH = dict(img_size=28, in_chans=1, num_classes=10, patch_size=7, embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0)
BATCH = 128
MARK = "CONTENTION "
OMP_WAIT = USER_WAIT  # what libgomp's waiting reads


def job_epochs(threads: int, images: int, repeats: int) -> None:
    """The job process: one warm-up epoch, then `repeats` timed ones; prints their seconds (and
    the process's CPU seconds) on one marked line."""
    import torch
    from timm.models.vision_transformer import VisionTransformer

    from pipeline_src.methods.training import fit
    from pipeline_src.runner.runtime import set_up_job

    set_up_job(threads, 0)
    model = VisionTransformer(**ARCH)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(images, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (images,), generator=gen)
    times, cpus = [], []
    for epoch in range(repeats + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        fit(model, list(model.parameters()), x, y, epochs=1, batch_size=BATCH, lr=1e-3, weight_decay=0.05,
            seed=epoch, desc="pretrain")
        if epoch:  # the first is the warm-up
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    print(MARK + json.dumps({"epoch_s": times, "cpu_s": cpus, "threads": torch.get_num_threads(),
                             "env": {k: os.environ.get(k) for k in OMP_WAIT}}), flush=True)


# Spins until stopped, or until this script dies (its parent changes): no busy orphan is left behind
BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(10**6):\n        pass\n"


def start_busy(k: int) -> list[subprocess.Popen]:
    """k processes that spin on the CPU until stopped."""
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(k)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run_case(policy: str, k: int, images: int, repeats: int, threads: int, timeout_s: float) -> dict:
    """One job process (`policy`) beside k busy processes; its marked line as a dict."""
    env = {key: v for key, v in os.environ.items() if key not in (*OMP_WAIT, "OMP_NUM_THREADS")}
    if policy.startswith("spincount="):
        env["GOMP_SPINCOUNT"] = policy.split("=", 1)[1]
    elif policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy != "spin":
        set_wait_policy(env)
    env["PYTHONPATH"] = str(REPO)
    busy = start_busy(k)
    try:
        time.sleep(0.5)  # let them take their CPU share first
        proc = subprocess.run([sys.executable, __file__, "--job", "--threads", str(1 if policy == "one" else threads),
                               "--images", str(images), "--repeats", str(repeats)],
                              capture_output=True, text=True, env=env, timeout=timeout_s)
    finally:
        stop(busy)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"case {policy}:k={k} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len(MARK):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2, 4], help="numbers of busy processes (0: idle)")
    parser.add_argument("--policies", nargs="+", default=["spin", "runner", "one"],
                        help="spin, runner, one, passive (OMP_WAIT_POLICY=PASSIVE) or spincount=N (GOMP_SPINCOUNT=N)")
    parser.add_argument("--threads", type=int, default=2, help="the job's declared threads")
    parser.add_argument("--images", type=int, default=2048, help="images an epoch (batch 128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs a case, after one warm-up")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a case may take")
    parser.add_argument("--out-dir", default=str(REPO / "results" / "benchmarks"))
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)  # the job process itself
    args = parser.parse_args()
    if args.job:
        job_epochs(args.threads, args.images, args.repeats)
        return

    import statistics

    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows

    cpus = len(os.sched_getaffinity(0))
    rows, idle = [], {}
    for policy in args.policies:
        for k in sorted(set(args.busy)):
            load = os.getloadavg()[0]
            got = run_case(policy, k, args.images, args.repeats, args.threads, args.timeout)
            median = statistics.median(got["epoch_s"])
            if k == 0:
                idle[policy] = median
            bound = max(1.0, (got["threads"] + k) / cpus)
            sizes = {"images": args.images, "batch": BATCH, "threads": got["threads"], "busy": k, "cpus": cpus,
                     "load_before": round(load, 2), "cpu_s_median": round(statistics.median(got["cpu_s"]), 2),
                     "env": got["env"], "share_bound": round(bound, 2)}
            if policy in idle:
                sizes["slowdown"] = round(median / idle[policy], 2)
            if "spin" in idle:  # against the idle epoch of the jobs before issue 44
                sizes["vs_spin_idle"] = round(median / idle["spin"], 2)
            rows.append(benchmark_row("contention", f"{policy}:k={k}", "cpu", sizes,
                                      [t * 1e3 for t in got["epoch_s"]], None,
                                      not_measured="a timing of epochs under CPU contention"))
            print(f"{policy:14s} k={k}: epoch {median:.2f} s (cpu {sizes['cpu_s_median']:.2f} s, "
                  f"{got['threads']} threads), slowdown {sizes.get('slowdown', float('nan')):.2f}x, "
                  f"share bound {bound:.2f}x, load before {load:.2f}", flush=True)
    print("wrote", write_benchmark_rows("contention", rows, args.out_dir))


if __name__ == "__main__":
    main()
