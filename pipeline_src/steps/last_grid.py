"""last_grid: train a grid of LAST side networks in one job on the same cached features.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024 -- side networks never backpropagate into the
backbone, so a whole hyperparameter grid (learning rates, ranks, heads, g, T, init seeds)
trains at once on one set of frozen features (`pipeline_src/last/grid.py`, vectorized).

The base is a `last` method of `methods:` (config `last_grid.method`); each list of
`last_grid` (lrs, ranks, heads, every, modules_per_block, init_seeds) replaces one of its
settings, an empty list keeps the method's value, and the grid is their product. One job per
shard count N and seed trains every member on shard 0 of `n{N}_s{seed}` (the whole training
split for N = 1) exactly as the `train` step trains the base method there (same features,
batch order `shard_seed(seed, 0)`, head and init seeds), so the member with the base
settings is that shard model (tests/e2e/test_last_grid.py). Every member is evaluated on
the val and test splits; one metrics file, one row per member, split and metric, `model`
`last-grid`, `variant` the JSON of the grid point.

The plan (`check_last_grid_config`, `grid_points`, `last_grid_targets`) is
`pipeline_src/plan/last_grid.py`.
"""
from __future__ import annotations

from pipeline_src.plan.last_grid import grid_points, point_label, point_variant

MODEL = "last-grid"


def main(args) -> None:
    import time

    import torch

    from pipeline_src.last.features import BlockBatches
    from pipeline_src.last.grid import train_side_grid
    from pipeline_src.last.train import build_side_network
    from pipeline_src.methods.evaluation import classification_metrics
    from pipeline_src.plan.feature_budget import kept_blocks
    from pipeline_src.plan.sharding import shard_ids
    from pipeline_src.steps.train import load_job, shard_seed
    from pipeline_src.store.metrics import metric_rows, write_metrics

    job = load_job(args)  # samples, manifest, backbone and settings exactly as the `train` step
    cfg = args.job_config()
    points = grid_points(cfg)
    shard = 0
    model = job.new_model()  # the base SideTuned: its prefix computes features when there is no cache
    t0 = time.perf_counter()
    depth = len(model.backbone.blocks)
    blocks = kept_blocks(depth, sorted({p["every"] for p in points}))  # what any member reads
    ids, features, labels = job.samples_data(model, shard_ids(job.manifest, shard), blocks=blocks)
    members = [{**model.member, "rank": p["rank"], "heads": p["heads"], "every": p["every"],
                "modules_per_block": p["modules_per_block"], "bias_correction": p["bias_correction"],
                "seed": p["init_seed"], "lr": p["lr"],
                "weight_decay": job.settings["weight_decay"]} for p in points]
    backbone = model.backbone
    num_classes = backbone.num_classes
    feats = BlockBatches(features, blocks)  # with a cache: each batch's rows read once, split per block
    states = train_side_grid(backbone, feats, labels, members, num_classes=num_classes,
                             epochs=job.settings["epochs"], batch_size=job.settings["batch_size"],
                             seed=shard_seed(job.seed, shard), schedule=job.settings.get("schedule"))
    print(f"trained {len(members)} side networks of {job.name} n{job.shards} shard {shard} on {len(ids)} samples "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    sides = []
    for member, state in zip(members, states):
        side = build_side_network(backbone, member, num_classes=num_classes).to(job.device)
        side.load_state_dict(state)
        own = [blocks.index(b) for b in range(0, depth + 1, member["every"])]  # this member's blocks
        sides.append((side.eval(), own))
    batch_size = job.settings["eval_batch_size"]
    rows = []
    for split in ("val", "test"):
        data = job.store.split("target", split)
        if not data.ids:
            continue
        _, split_feats, split_labels = job.samples_data(model, data.ids, blocks=blocks, batch_size=batch_size)
        logits = [[] for _ in sides]
        with torch.no_grad():  # each chunk read once (from a cache: only its rows), then every member on it
            for s in range(0, len(data.ids), batch_size):
                h = split_feats[torch.arange(s, min(s + batch_size, len(data.ids)))]
                for out, (side, own) in zip(logits, sides):
                    out.append(side(list(h[:, own].unbind(1))).cpu())
        for point, out in zip(points, logits):
            values = classification_metrics(torch.cat(out), split_labels.cpu())
            context = dict(experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method=job.name, kind="last",
                           model=MODEL, variant=point_variant(point), shards=job.shards, shard_id=shard, seed=job.seed,
                           split=split, num_samples=len(data.ids))
            rows += metric_rows(values, context=context, device=job.device, wall_time_s=time.perf_counter() - t0)
            print(f"{point_label(point)} {split}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
    write_metrics(rows, args.output.metrics)  # atomic
