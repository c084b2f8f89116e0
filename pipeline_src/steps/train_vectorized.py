"""train_vectorized: the shard models of one method, N and seed in one job, vectorized over shards
(taft: `taft.train.train_tangent_vectorized`; fc, nlft, last: `methods.vectorized`). Writes the same
files, with the same contents up to float rounding, as the per-shard `train` jobs. The shards it
trains are its outputs: those no forget request touches (`plan.vectorized`); the others train in
per-shard jobs."""
from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from pipeline_src.methods.kinds import kind_of
from pipeline_src.methods.registry import taft_options
from pipeline_src.methods.vectorized import train_shards_vectorized
from pipeline_src.runner.runtime import use_bf16
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.train import TrainingJob, load_job, shard_seed
from pipeline_src.taft.train import train_tangent_vectorized


def output_shards(models: list[str]) -> list[int]:
    """The shard index of each output model path (`.../shard{i}.safetensors`)."""
    out = []
    for path in models:
        m = re.fullmatch(r"shard(\d+)\.safetensors", Path(path).name)
        if m is None:
            raise ValueError(f"train_vectorized: output {path!r} is not a shard{{i}}.safetensors path")
        out.append(int(m.group(1)))
    return out


# The stacked batch holds N x batch rows, so at N >= 25 its activations pass the jobs' 4 MiB mmap
# threshold (runner/execute.py, which pins this step's instead) and every step maps and unmaps them
# afresh (page faults). 64 MiB keeps them on the heap: taft-1 at N = 50, 30 images a shard, one
# epoch 1.32 -> 0.83 s (benchmarks/bench_vectorized_shards.py under MALLOC_MMAP_THRESHOLD_, 2026-11-27).
MMAP_THRESHOLD = 64 << 20


def main(args: StepArgs) -> None:
    # One rule per method, N and seed: they come as params, not wildcards.
    args.wildcards.update(method=args.params["method"], shards=str(args.params["shards"]),
                          seed=str(args.params["seed"]))
    job = load_job(args)
    job.bf16 = use_bf16(job.settings["precision"], job.device)  # as the per-shard `train` step
    shards = output_shards(list(args.output.models))
    model = job.new_model()
    t0 = time.perf_counter()
    data = [job.shard_data(model, i) for i in shards]
    seeds = [shard_seed(job.seed, i) for i in shards]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=job.bf16):
        if kind_of(job.method_cfg).tangent:
            states = _train_taft(job, model, data, seeds)
        else:
            res = train_shards_vectorized(model, job.method_cfg, [(f, y) for _, f, y in data],
                                          {**job.settings, "method": job.method_cfg}, seeds, _progress(job))
            states = [(r["state"], r["stats"]) for r in res]
    wall = (time.perf_counter() - t0) / len(shards)
    for i, path, (ids, _, _), (state, stats) in zip(shards, args.output.models, data, states):
        job.save(state, i, ids, {**stats, "vectorized_over_shards": len(shards)}, wall, path)


def _progress(job: TrainingJob):
    return lambda e, losses: print(f"{job.name} n{job.shards}: epoch {e + 1} losses {losses}", flush=True)


def _train_taft(job: TrainingJob, model, data: list, seeds: list[int]) -> list[tuple[dict, dict]]:
    o, s = taft_options(job.method_cfg), job.settings
    results = train_tangent_vectorized(
        model, [(f, y) for _, f, y in data], epochs=s["epochs"], batch_size=s["batch_size"], lr=s["lr"],
        weight_decay_l2=o["l2"], loss=o["loss"], alpha=o["alpha"], kappa=o["kappa"], radius=o["radius"],
        seed=seeds, schedule=s.get("schedule"), progress=_progress(job))
    out = []
    for res in results:
        model.load_trainable_state(res["delta_state_dict"])
        out.append((res["delta_state_dict"], {"train_loss": res["loss_history"][-1], "steps": res["steps"],
                                              "linearization_id": model.linearization_id()}))
    return out
