"""The pipeline's GPU checks, run as real Snakemake studies with `device: cuda` (issues 23, 25, 41).

Parts (each a real `snakemake` run in its own work folder under --workdir), in the order given:
  vitb     `benchmarks/gpu_vitb16.yaml`: the ViT-B/16 rules at 224 px, batch 256, bfloat16:
           `pretrain`, `features`, `train`, then the rest (`evaluate_shards` ...), each its own
           `--until` phase while `nvidia-smi` samples the GPU every 200 ms.
  table2   `benchmarks/gpu_table2_vitb16.yaml`: "Table 2 at scale", 10,000 images at 224 px,
           nlft-1 and taft-1 (k = 1) at N = 1, 10, 25, 50, 30 epochs, one seed (issue 41: <= 5 min).
  fashion  `studies/fashion_mnist.yaml`, the far regime end to end (issue 41: <= 3 min).
  near     `studies/fashion_near.yaml`, the near regime; with `fashion` finished too, the
           cross-regime report (`pipeline_src.reports.cross_regime`) is a phase of its own.
  tiny     `.test/config.yaml`, the test suite's tiny study, end to end.
  mps      the far study's `train` jobs at N = 10 (70 small jobs), as separate CUDA contexts, then
           under NVIDIA MPS (issue 34).
--budget caps the whole run: each phase gets what is left of it (and at most --timeout); a part
that no time is left for gets a row saying so. A phase out of time is stopped by SIGKILL of
Snakemake's process group; its jobs' orphan guards then stop them within 0.2 s (their fork-server
children and GPU workers included), and no output appears after the kill (`store/atomic.py`).

Writes <out-dir>/gpu_study.parquet and gpu_study.md: one row per phase (wall time, jobs done of
planned, GPU utilisation: mean over the phase and over its active window, peak GPU memory) and,
from each study's own efficiency table (`report/efficiency.csv`; for a study cut short, one made
from its finished jobs), one row per rule (jobs, images/s,
GFLOP/s, % of the peak the table names, and of the GPU's nominal dense peak in the dtype the rule
computes in: `NOMINAL_TFLOPS`).

    python benchmarks/bench_gpu_study.py --data DIR --budget 520 --part vitb --part table2 --part fashion --part near
    python benchmarks/bench_gpu_study.py --smoke --data DIR --part vitb   # CPU, tiny sizes: checks the script
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
from pipeline_src.store.atomic import write_parquet, write_text  # noqa: E402

STUDIES = {"vitb": "benchmarks/gpu_vitb16.yaml", "table2": "benchmarks/gpu_table2_vitb16.yaml",
           "fashion": "studies/fashion_mnist.yaml", "near": "studies/fashion_near.yaml", "tiny": ".test/config.yaml",
           "mps": "studies/fashion_mnist.yaml"}
PHASES = {"vitb": ["pretrain", "features", "train", None], "table2": [None], "fashion": [None], "near": [None],
          "tiny": [None], "mps": ["pretrain", "train", "train@plain", "train@mps"]}
MPS_OVERLAY = """backbone: {pretrain: {epochs: 2, schedule: {warmup_epochs: 0}}}
shards: [10]
# the study file trains these at N = 1 only and searches at N = 1 and 10: at N = 10 here
methods: {nlft-2: {shards: [10]}, taft-2: {shards: [10]}, full: {shards: [10]}, scratch: {shards: [10]}}
search: {shards: [10]}
fusion: {enabled: false}
forget: {study: {enabled: false}}
privacy: {enabled: false, seeds: [0]}
"""
MPS_ENV = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps-pipe", "CUDA_MPS_LOG_DIRECTORY": "/tmp/mps-log"}
# --smoke: the same parts on the CPU at tiny sizes (a ViT-Tiny at 32 px; the Fashion studies cut
# to 4 images a class, one epoch, no side studies), so the script's own logic runs in the test suite.
SMOKE_VIT = """device: cpu
dataset: {img_size: 32, limit_per_class: 6, val_fraction: 0.2}
backbone: {timm_name: vit_tiny_patch16_224}
train: {batch_size: 8, eval_batch_size: 16, num_workers: 0, epochs: 1}
"""
SMOKE_FASHION = """device: cpu
dataset: {limit_per_class: 4, test_limit_per_class: same, source_limit_per_class: 8}
backbone: {pretrain: {epochs: 1, schedule: {warmup_epochs: 0}}}
train: {epochs: 2, schedule: {milestones: [1]}}
shards: [1, 2]
seeds: [0]
fusion: {enabled: false}
forget: {study: {enabled: false}}
privacy: {enabled: false, seeds: [0]}
search: {enabled: false}
"""
SMOKE = {"vitb": SMOKE_VIT, "table2": SMOKE_VIT + "shards: [1, 2]\n", "fashion": SMOKE_FASHION,
         "near": SMOKE_FASHION, "mps": SMOKE_FASHION, "tiny": "device: cpu\n"}
# Dense (no sparsity) peak TFLOP/s of the tensor cores per dtype, from NVIDIA's data sheets (SXM parts;
# the PCIe H100 is 756 bf16). A rule's share of it is the honest figure on a GPU whatever probe its
# efficiency table used (issue 41: a float32 probe overstated bf16 jobs about 15-fold).
NOMINAL_TFLOPS = {"H200": {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.0, "float32": 67.0},
                  "H100 PCIe": {"bfloat16": 756.0, "float16": 756.0, "tf32": 378.0, "float32": 51.0},
                  "H100": {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.0, "float32": 67.0},
                  "A100": {"bfloat16": 312.0, "float16": 312.0, "tf32": 156.0, "float32": 19.5}}


def start_mps() -> bool:
    """Start the MPS control daemon (clients find it through MPS_ENV); False where there is none."""
    if shutil.which("nvidia-cuda-mps-control") is None:
        return False
    for d in MPS_ENV.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    return subprocess.run(["nvidia-cuda-mps-control", "-d"], env={**os.environ, **MPS_ENV}).returncode == 0


def stop_mps() -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env={**os.environ, **MPS_ENV})


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


def processes_in(folder: Path) -> list[int]:
    """Pids of processes whose working directory is inside `folder` (a study's jobs)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def stop_run(proc: subprocess.Popen, workdir: Path, wait_s: float = 15.0) -> bool:
    """Stop a Snakemake run now: SIGINT to its process group, SIGKILL after a grace period
    (Snakemake's SIGTERM would wait for its running jobs; docs/reliability.md), then wait for any
    job left to end (the orphan guard); False if some still run."""
    stop_snakemake(proc, grace_s=wait_s)
    deadline = time.monotonic() + wait_s
    while processes_in(workdir) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not processes_in(workdir)


def run_phase(cmd: list[str], workdir: Path, log: Path, util_csv: Path, timeout_s: float,
              env: dict | None = None) -> dict:
    """Run one snakemake phase with the sampler on; returns wall time, jobs done and utilisation."""
    sampler = gpu_sampler(util_csv)
    start = time.perf_counter()
    finished, stopped_clean = True, None
    with open(log, "w") as fh:
        proc = start_snakemake(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            finished = False
            stopped_clean = stop_run(proc, workdir)
            print(f"{log.name}: stopped after {timeout_s:.0f} s (clean: {stopped_clean})", flush=True)
        except BaseException:  # Ctrl-C of this script, or an error: stop the run too
            stop_run(proc, workdir)
            raise
    wall = time.perf_counter() - start
    if sampler is not None:
        sampler.terminate()
        sampler.wait()
    done = re.findall(r"(\d+) of (\d+) steps", log.read_text(errors="replace"))
    planned = re.search(r"^total\s+(\d+)\s*$", log.read_text(errors="replace"), re.M)
    return {"wall_s": wall, "finished": finished and proc.returncode == 0, "returncode": proc.returncode,
            "jobs_done": int(done[-1][0]) if done else 0,
            "jobs_total": int(done[-1][1]) if done else int(planned[1]) if planned else 0,
            "jobs_stopped_clean": stopped_clean, **utilisation(util_csv)}


def nominal_peak(device: str, dtype: str | None) -> float | None:
    """The GPU's nominal dense TFLOP/s in `dtype` (None: unknown GPU or dtype)."""
    for name, peaks in NOMINAL_TFLOPS.items():  # "H100 PCIe" before "H100": the dict's order
        if name in device and dtype in peaks:
            return peaks[dtype]
    return None


def rule_rows(efficiency_csv: Path, part: str, device: str, precision: str) -> list[dict]:
    """One row per rule of a study's efficiency table (none if the study did not get that far)."""
    if not efficiency_csv.exists():
        return []
    rows = []
    with open(efficiency_csv) as fh:
        for rec in csv.DictReader(fh):
            def num(key: str) -> float | None:
                return float(rec[key]) if rec.get(key) not in (None, "") else None

            # the math mode the table's peak was measured in (its `math` column, issue 41 item 1):
            # the mode the rule's jobs computed in; else the study's precision
            table_dtype = rec.get("math") or None
            dtype = (table_dtype or precision) if device != "cpu" else "float32"
            peak = nominal_peak(device, dtype)
            gflops = num("gflop_per_s")
            rows.append({"part": part, "kind": "rule", "phase": rec["rule"], "device": device,
                         "jobs_done": int(num("jobs") or 0), "wall_s": num("wall_s"), "images": num("images"),
                         "images_per_s": num("images_per_s"), "gflop_per_s": gflops,
                         "table_peak_pct": num("peak_pct"), "table_peak_dtype": table_dtype,
                         "dtype": dtype, "nominal_peak_tflops": peak,
                         "nominal_peak_pct": 100 * gflops / (peak * 1000) if gflops and peak else None})
    return rows


def efficiency_table(results: Path, wd: Path) -> Path:
    """The study's efficiency table: its report's, or for a study cut short, one made here from the
    jobs that finished (`reports/efficiency.py`, into <wd>/efficiency/)."""
    done = results / "report" / "efficiency.csv"
    if done.exists() or not results.exists():
        return done
    try:
        from pipeline_src.reports.efficiency import efficiency_report
        from pipeline_src.store.results_db import connect

        efficiency_report(connect(results), wd / "efficiency")
    except Exception as err:  # noqa: BLE001 (a missing table is a row without figures, not a failed run)
        print(f"    no efficiency table for {results}: {err}", flush=True)
    return wd / "efficiency" / "efficiency.csv"


def device_label(smoke: bool) -> str:
    if smoke or shutil.which("nvidia-smi") is None:
        return "cpu"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "cuda"


def markdown(rows: list[dict]) -> str:
    """The rows as one Markdown table (blank where a figure does not apply)."""
    cols = [("part", "part"), ("kind", "row"), ("phase", "phase / rule"), ("finished", "finished"),
            ("wall_s", "wall s"), ("jobs_done", "jobs"), ("jobs_total", "of"), ("images_per_s", "images/s"),
            ("gflop_per_s", "GFLOP/s"), ("dtype", "dtype"), ("nominal_peak_pct", "% dtype peak"),
            ("table_peak_pct", "% table peak"), ("util_mean_pct", "util %"), ("util_active_mean_pct", "active util %"),
            ("gpu_mem_used_max_mb", "GPU MB")]

    def cell(v) -> str:
        return "" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(k)) for k, _ in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def overlay_text(part: str, args: argparse.Namespace) -> str:
    text = f"device: {'cpu' if args.smoke else 'cuda'}\n"
    if part != "tiny":
        text += f"dataset:\n  path: {Path(args.data).resolve()}\n"
    if part == "mps":
        text += MPS_OVERLAY
    return text + (args.overlay + "\n" if args.overlay else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", action="append", choices=sorted(STUDIES), help="repeatable, run in this order "
                   "(default: vitb, table2, fashion, near)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder of the four IDX files")
    p.add_argument("--workdir", default="results/gpu_study", help="each part's study runs in <workdir>/<part>")
    p.add_argument("--out-dir", default="results/benchmarks")
    p.add_argument("--cores", type=int, default=16)
    p.add_argument("--timeout", type=float, default=330.0, help="seconds per phase at most")
    p.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default: no cap)")
    p.add_argument("--cap", action="append", default=[], metavar="PART=S",
                   help="seconds for one part's phases together, e.g. fashion=200 (repeatable)")
    p.add_argument("--snakemake-args", default="", help="more snakemake arguments, e.g. '--scheduler greedy'")
    p.add_argument("--smoke", action="store_true", help="CPU and tiny sizes: checks this script, measures nothing")
    p.add_argument("--mps", action="store_true", help="run every phase under NVIDIA MPS (the mps part's own phases choose)")
    p.add_argument("--overlay", default="", help="YAML appended to every part's overlay, e.g. 'train: {precision: bfloat16}'")
    args = p.parse_args()
    parts = args.part or ["vitb", "table2", "fashion", "near"]
    workdir = Path(args.workdir).resolve()
    device = device_label(args.smoke)
    end = time.monotonic() + args.budget if args.budget else float("inf")
    caps = {}
    for item in args.cap:
        name, _, seconds = item.partition("=")
        if name not in STUDIES or not re.fullmatch(r"\d+(\.\d*)?", seconds):
            p.error(f"--cap {item!r}: expected PART=SECONDS with PART one of {', '.join(sorted(STUDIES))}")
        caps[name] = float(seconds)
    rows: list[dict] = []
    finished_parts: dict[str, Path] = {}
    for part in parts:
        wd = workdir / part
        wd.mkdir(parents=True, exist_ok=True)
        overlay = wd / "overlay.yaml"
        overlay.write_text(overlay_text(part, args))
        configs = [str(REPO / STUDIES[part]), str(overlay)]
        if args.smoke:
            (wd / "smoke.yaml").write_text(SMOKE[part])
            configs.append(str(wd / "smoke.yaml"))
        study = yaml.safe_load((REPO / STUDIES[part]).read_text())
        precision = study.get("train", {}).get("precision", "float32")
        part_rows = []
        part_end = min(end, time.monotonic() + caps.get(part, float("inf")))
        for phase in PHASES[part]:
            name = (phase or "all").replace("@", "_")
            left = part_end - time.monotonic()
            if left < 10:
                part_rows.append({"part": part, "kind": "phase", "phase": name, "device": device, "finished": False,
                                  "note": "not run: its time (--budget, --cap) was spent"})
                break
            rule, _, mode = (phase or "").partition("@")
            cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(wd),
                   "--cores", str(args.cores), "--configfile", *configs, *shlex.split(args.snakemake_args)]
            if rule:
                cmd += ["--until", rule]
            env, mps = None, None
            if mode:  # the same jobs again (the first run also built their inputs): plain, then under MPS
                cmd += ["--forcerun", rule]
            if mode == "mps" or (args.mps and not mode):
                mps = start_mps()
                env = MPS_ENV if mps else None
            print(f"=== {part}/{name} ({left:.0f} s left): {' '.join(cmd)}", flush=True)
            row = run_phase(cmd, wd, wd / f"{name}.log", wd / f"{name}.util.csv", min(args.timeout, left), env)
            if mps:
                stop_mps()
            part_rows.append({"part": part, "kind": "phase", "phase": name, "device": device, "mps": mps, **row})
            print(f"    {row}", flush=True)
            if not row["finished"]:
                break
        if part_rows and all(r.get("finished") for r in part_rows):
            finished_parts[part] = wd / "results" / study["experiment"]
        rows += part_rows + rule_rows(efficiency_table(wd / "results" / study["experiment"], wd), part, device,
                                      precision)
    if {"fashion", "near"} <= set(finished_parts) and end - time.monotonic() > 10:
        rows.append(cross_regime(finished_parts, workdir, device))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))  # every row's keys (from_pylist takes the first's)
    write_parquet(pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows]), out / "gpu_study.parquet")
    table = markdown(rows)
    write_text(f"# GPU study ({device})\n\n{table}", out / "gpu_study.md")
    print(table)


def cross_regime(results: dict[str, Path], workdir: Path, device: str) -> dict:
    """The cross-regime report of the two Fashion-MNIST regimes, timed as a phase of its own."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline_src.reports.cross_regime", str(results["near"]),
                           str(results["fashion"]), "--out", str(workdir / "fashion-regimes")],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    (workdir / "cross_regime.log").write_text(proc.stdout + proc.stderr)
    return {"part": "near", "kind": "phase", "phase": "cross_regime", "device": device,
            "wall_s": time.perf_counter() - start, "finished": proc.returncode == 0, "returncode": proc.returncode}


if __name__ == "__main__":
    main()
