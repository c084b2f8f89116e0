"""A job's fixed cost: from its client's start to its first batch on the device (issue 41, item 3).

Each repeat starts a fresh client process, as Snakemake starts a job's script (Python, then
Snakemake's script module where installed, then the launcher's client code), which runs a probe
job whose first batch (a small MLP's forward and backward on the device: CUDA where visible)
stamps the wall clock. The fixed cost is that stamp minus the moment the client was spawned.
Three ways a job runs (`pipeline_src/runner/launch.py`):

  own_process   `job_process.run_measured`: a new interpreter imports torch (and opens a CUDA context)
  fork_server   `forkserver.run_in_server`: a forked child of a server that imported torch
                (it opens its own CUDA context: a process that holds one cannot fork)
  gpu_server    `gpu_server.run_in_gpu_server`: a worker that holds its context runs the job

Case `<way>/cold` is the first job (the server's start included), `<way>/warm` the median of the
repeats after it. Rows go to <out-dir>/job_start.parquet (`store/benchmark_rows.py`), with the
job's peak RSS as its launcher measured it.

    python benchmarks/bench_job_start.py                 # 5 warm repeats per way
    python benchmarks/bench_job_start.py --repeats 2 --way gpu_server
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

WAYS = ("own_process", "fork_server", "gpu_server")
CLIENT = """
import importlib.util, json, sys
from pathlib import Path
if importlib.util.find_spec("snakemake"):
    import snakemake.script  # what a job's script process imports before the launcher
way, out, sock = sys.argv[1], sys.argv[2], Path(sys.argv[3])
call, job = "bench_job_start:first_batch", {"out": out}
if way == "gpu_server":
    from pipeline_src.runner.gpu_server import run_in_gpu_server
    done = run_in_gpu_server("probe", job, call=call, path=sock)
elif way == "fork_server":
    from pipeline_src.runner.forkserver import run_in_server
    done = run_in_server("probe", job, call=call, path=sock)
else:
    from pipeline_src.runner.job_process import run_measured
    done = run_measured("probe", job, call=call)
print(json.dumps({"code": done.code, "peak_kib": done.peak_kib}))
"""


def first_batch(step: str, args: dict) -> int:
    """The probe job: one training batch of a small model on the job's device, then the stamp."""
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).to(dev)
    loss = torch.nn.functional.cross_entropy(model(torch.randn(64, 256, device=dev)),
                                             torch.randint(0, 10, (64,), device=dev))
    loss.backward()
    float(loss)  # waits for the device
    Path(args["out"]).write_text(json.dumps({"t": time.time(), "device": str(dev)}))
    return 0


def one_job(way: str, sock: Path, tmp: Path) -> tuple[float, int | None, str]:
    """Spawn a client that runs the probe `way`; (seconds to the first batch, job peak KiB, device)."""
    out = tmp / f"stamp-{time.monotonic_ns()}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", CLIENT, way, str(out), str(sock)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)
    if proc.returncode or not out.exists():
        raise RuntimeError(f"{way}: the probe job failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    stamp = json.loads(out.read_text())
    return stamp["t"] - t0, json.loads(proc.stdout.strip().splitlines()[-1])["peak_kib"], stamp["device"]


def stop_servers(folder: Path) -> None:
    """End the servers (and their workers) this run started: the processes naming its socket folder."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(folder).encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            continue


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--way", action="append", choices=WAYS, help="repeatable (default: all three)")
    p.add_argument("--repeats", type=int, default=5, help="warm jobs per way after the cold one")
    p.add_argument("--out-dir", default="results/benchmarks")
    args = p.parse_args()
    from pipeline_src.store.benchmark_rows import benchmark_row, write_benchmark_rows

    rows = []
    with tempfile.TemporaryDirectory(prefix="job-start-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            for way in args.way or WAYS:
                sock = tmp / f"{way}.sock"
                times, peaks, device = [], [], "cpu"
                for _ in range(1 + args.repeats):
                    s, peak, device = one_job(way, sock, tmp)
                    times.append(s * 1000.0)
                    peaks.append(peak)
                for case, ts, ps in (("cold", times[:1], peaks[:1]), ("warm", times[1:], peaks[1:])):
                    if not ts:
                        continue
                    known = [x for x in ps if x]
                    rows.append(benchmark_row(
                        "job_start", f"{way}/{case}", device, {"repeats": len(ts), "client": "fresh python"}, ts,
                        max(known) / 1024 if known else None, method="the job's peak RSS as its launcher measured it",
                        not_measured=None if known else "the launcher measured no peak"))
                    print(f"{way:12s} {case:5s} {device:5s} first batch after {sorted(ts)[len(ts) // 2]:8.1f} ms "
                          f"(all: {', '.join(f'{t:.0f}' for t in ts)})", flush=True)
        finally:
            stop_servers(tmp)
    print(write_benchmark_rows("job_start", rows, args.out_dir))


if __name__ == "__main__":
    main()
