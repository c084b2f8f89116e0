"""train_vectorized: all N shard tangent models of one study in one job, vectorized over shards
(`torch.func.vmap`), the TAFT paper's parallel training without N processes. Writes the same
files, with the same contents up to float rounding, as N separate `train` jobs."""
from __future__ import annotations

import time

from pipeline_src.methods.kinds import kind_of
from pipeline_src.methods.registry import taft_options
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.train import load_job, shard_seed
from pipeline_src.taft.train import train_tangent_vectorized


def main(args: StepArgs) -> None:
    # One rule per method and N: they come as params, not wildcards.
    args.wildcards.update(method=args.params["method"], shards=str(args.params["shards"]))
    job = load_job(args)
    if not kind_of(job.method_cfg).tangent:
        raise ValueError(f"config key 'methods.{job.name}.vectorized_shards': only kind 'taft' trains vectorized")
    model = job.new_model()
    t0 = time.perf_counter()
    data = [job.shard_data(model, i) for i in range(job.shards)]
    o, s = taft_options(job.method_cfg), job.settings
    results = train_tangent_vectorized(
        model, [(f, y) for _, f, y in data], epochs=s["epochs"], batch_size=s["batch_size"], lr=s["lr"],
        weight_decay_l2=o["l2"], loss=o["loss"], alpha=o["alpha"], kappa=o["kappa"], radius=o["radius"],
        seed=[shard_seed(job.seed, i) for i in range(job.shards)], schedule=s.get("schedule"),
        progress=lambda e, losses: print(f"{job.name} n{job.shards}: epoch {e + 1} losses {losses}", flush=True))
    wall = (time.perf_counter() - t0) / job.shards
    for i, ((ids, _, _), res) in enumerate(zip(data, results)):
        model.load_trainable_state(res["delta_state_dict"])
        stats = {"train_loss": res["loss_history"][-1], "steps": res["steps"],
                 "linearization_id": model.linearization_id(), "vectorized_over_shards": job.shards}
        job.save(res["delta_state_dict"], i, ids, stats, wall, args.output.models[i])
