"""The pipeline's GPU checks, run as real Snakemake studies with `device: cuda` (issues 23 and 25).

Parts (each a real `snakemake` run in its own work folder under --workdir):
  vitb     `benchmarks/gpu_vitb16.yaml`: the `features` and `train` rules at 224 px with a
           ViT-B/16, batch 256, bfloat16. Each rule runs as its own `--until` phase while
           `nvidia-smi` samples the GPU's utilisation every 200 ms; images/s come from the study's
           own `results/<experiment>/report/efficiency.csv` (the jobs' counters).
  fashion  `studies/fashion_mnist.yaml`, the whole study, timed against issue 23's 5-minute goal
           (`--timeout`; a study cut short reports how many of its jobs finished).
  tiny     `.test/config.yaml`, the test suite's tiny study, end to end.
  mps      the Fashion-MNIST study's `train` jobs at N = 10 (70 small jobs; a 2-epoch backbone,
           fusion, forgetting and DP off: only the jobs' sharing of one GPU is measured), run
           with --cores jobs at once, after a first run that builds their inputs: again as separate
           CUDA contexts (`train_plain`), then under NVIDIA MPS (`train_mps`)
           (`nvidia-cuda-mps-control -d`; the row says when the driver offers none) (issue 34).
Writes one row per (part, phase) to <out-dir>/gpu_study.parquet: device, wall time, jobs done,
utilisation (mean over the phase, and over its active window: first to last sample above 0 %),
GPU memory used, and the rule's images/s where the report has it.

    python benchmarks/bench_gpu_study.py --data /usr/share/datasets/fashion-mnist --part vitb --part fashion
    python benchmarks/bench_gpu_study.py --smoke --part vitb     # CPU, tiny sizes: checks the script
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline_src.runner.stop_run import start_snakemake, stop_snakemake  # noqa: E402
from pipeline_src.store.atomic import write_parquet  # noqa: E402

STUDIES = {"vitb": "benchmarks/gpu_vitb16.yaml", "fashion": "studies/fashion_mnist.yaml", "tiny": ".test/config.yaml",
           "mps": "studies/fashion_mnist.yaml"}
PHASES = {"vitb": ["pretrain", "features", "train", None], "fashion": [None], "tiny": [None],
          "mps": ["pretrain", "train", "train@plain", "train@mps"]}
MPS_OVERLAY = """backbone: {pretrain: {epochs: 2}}
shards: [10]
fusion: {enabled: false}
forget: {study: {enabled: false}}
privacy: {enabled: false}
"""
MPS_ENV = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps-pipe", "CUDA_MPS_LOG_DIRECTORY": "/tmp/mps-log"}


def start_mps() -> bool:
    """Start the MPS control daemon (clients find it through MPS_ENV); False where there is none."""
    if shutil.which("nvidia-cuda-mps-control") is None:
        return False
    for d in MPS_ENV.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **MPS_ENV}
    return subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env).returncode == 0


def stop_mps() -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env={**os.environ, **MPS_ENV})
SMOKE = """device: cpu
dataset: {img_size: 32, limit_per_class: 6, val_fraction: 0.2}
backbone: {timm_name: vit_tiny_patch16_224}
train: {batch_size: 8, eval_batch_size: 16, num_workers: 0, epochs: 1}
"""


def gpu_sampler(path: Path) -> subprocess.Popen | None:
    """Start `nvidia-smi` writing utilisation and memory every 200 ms, or None without a GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    fh = open(path, "w")
    return subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                             "--format=csv,noheader,nounits", "-lms", "200"], stdout=fh, stderr=subprocess.DEVNULL)


def utilisation(path: Path) -> dict:
    """Mean utilisation over all samples and over the active window, and the peak memory used."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                rows.append((int(parts[0]), int(parts[1])))
    if not rows:
        return {"util_mean_pct": None, "util_active_mean_pct": None, "gpu_mem_used_max_mb": None, "samples": 0}
    util = [u for u, _ in rows]
    active = [i for i, u in enumerate(util) if u > 0]
    window = util[active[0]:active[-1] + 1] if active else [0]
    return {"util_mean_pct": sum(util) / len(util), "util_active_mean_pct": sum(window) / len(window),
            "gpu_mem_used_max_mb": float(max(m for _, m in rows)), "samples": len(rows)}


def run_phase(cmd: list[str], log: Path, util_csv: Path, timeout_s: float, env: dict | None = None) -> dict:
    """Run one snakemake phase with the sampler on; returns wall time, jobs done and utilisation."""
    sampler = gpu_sampler(util_csv)
    start = time.perf_counter()
    finished = True
    with open(log, "w") as fh:
        proc = start_snakemake(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            finished = False
            # SIGINT to the run's process group: its jobs end now (SIGTERM to Snakemake waits for them;
            # docs/reliability.md); SIGKILL after 60 s, when the orphan guard ends them
            print(f"{log.name}: stopped after {timeout_s:.0f} s ({stop_snakemake(proc)})", flush=True)
        except BaseException:  # Ctrl-C of this script, or an error: stop the run too
            stop_snakemake(proc)
            raise
    wall = time.perf_counter() - start
    if sampler is not None:
        sampler.terminate()
        sampler.wait()
    done = re.findall(r"(\d+) of (\d+) steps", log.read_text(errors="replace"))
    return {"wall_s": wall, "finished": finished and proc.returncode == 0, "returncode": proc.returncode,
            "jobs_done": int(done[-1][0]) if done else 0, "jobs_total": int(done[-1][1]) if done else 0,
            **utilisation(util_csv)}


def rule_rates(efficiency_csv: Path) -> dict[str, dict]:
    """images/s and images per rule from the study's efficiency table (empty if it is missing)."""
    if not efficiency_csv.exists():
        return {}
    with open(efficiency_csv) as fh:
        return {row["rule"]: row for row in csv.DictReader(fh)}


def device_label(smoke: bool) -> str:
    if smoke or shutil.which("nvidia-smi") is None:
        return "cpu"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "cuda"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", action="append", choices=sorted(STUDIES), help="repeatable (default: vitb, fashion)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder of the four IDX files")
    p.add_argument("--workdir", default="results/gpu_study", help="each part's study runs in <workdir>/<part>")
    p.add_argument("--out-dir", default="results/benchmarks")
    p.add_argument("--cores", type=int, default=16)
    p.add_argument("--timeout", type=float, default=330.0, help="seconds per phase before it is stopped")
    p.add_argument("--snakemake-args", default="", help="more snakemake arguments, e.g. '--scheduler greedy'")
    p.add_argument("--smoke", action="store_true", help="CPU and tiny sizes: checks this script, measures nothing")
    p.add_argument("--mps", action="store_true", help="run every phase under NVIDIA MPS (the mps part's own phases choose)")
    p.add_argument("--overlay", default="", help="YAML appended to every part's overlay, e.g. 'train: {precision: bfloat16}'")
    args = p.parse_args()
    parts = args.part or ["vitb", "fashion"]
    workdir = Path(args.workdir).resolve()
    device = device_label(args.smoke)
    rows = []
    for part in parts:
        wd = workdir / part
        wd.mkdir(parents=True, exist_ok=True)
        overlay = wd / "overlay.yaml"
        text = f"device: {'cpu' if args.smoke else 'cuda'}\n"
        if part != "tiny":
            text += f"dataset:\n  path: {Path(args.data).resolve()}\n"
        if part == "mps":
            text += MPS_OVERLAY
        text += args.overlay + "\n" if args.overlay else ""
        overlay.write_text(text)
        configs = [str(REPO / STUDIES[part]), str(overlay)]
        if args.smoke:
            (wd / "smoke.yaml").write_text(SMOKE if part == "vitb" else "device: cpu\n")
            configs.append(str(wd / "smoke.yaml"))
        part_rows = []
        for phase in PHASES[part]:
            name = (phase or "all").replace("@", "_")
            rule, _, mode = (phase or "").partition("@")
            cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(wd),
                   "--cores", str(args.cores), "--configfile", *configs]
            cmd += shlex.split(args.snakemake_args)
            if rule:
                cmd += ["--until", rule]
            env, mps = None, None
            if mode:  # the same jobs again (the first run also built their inputs): plain, then under MPS
                cmd += ["--forcerun", rule]
            if mode == "mps" or (args.mps and not mode):
                mps = start_mps()
                env = MPS_ENV if mps else None
            print(f"=== {part}/{name}: {' '.join(cmd)}", flush=True)
            row = run_phase(cmd, wd / f"{name}.log", wd / f"{name}.util.csv", args.timeout, env)
            if mps:
                stop_mps()
            part_rows.append({"part": part, "phase": name, "device": device, "mps": mps, **row})
            print(f"    {row}", flush=True)
            if not row["finished"]:
                break
        study = yaml.safe_load((REPO / STUDIES[part]).read_text())["experiment"]  # results/<experiment>/
        rates = rule_rates(wd / "results" / study / "report" / "efficiency.csv")
        for row in part_rows:  # a phase named after a rule gets that rule's figures (a whole-study run's table)
            rate = rates.get(row["phase"], {})
            for key in ("images", "images_per_s", "gflop_per_s", "in_step_pct"):
                row[key] = float(rate[key]) if rate.get(key) not in (None, "") else None
        rows += part_rows
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(pa.Table.from_pylist(rows), out / "gpu_study.parquet")
    for row in rows:
        print(f"{row['part']:8s} {row['phase']:9s} {row['wall_s']:7.1f} s  finished={row['finished']}  "
              f"jobs {row['jobs_done']}/{row['jobs_total']}  util {row['util_mean_pct']} "
              f"(active {row['util_active_mean_pct']})  images/s {row.get('images_per_s')}")


if __name__ == "__main__":
    main()
