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

The plan (`check_last_grid_config`, `grid_points`, `last_grid_targets`) imports no torch:
`pipeline_src/plan/config.py` and `workflow/rules/last_grid.smk` call it at parse time.
"""
from __future__ import annotations

import itertools
import json

from pipeline_src.plan.config import ConfigError

MODEL = "last-grid"
# last_grid list key -> the base method's key it replaces (and its default there).
GRID_KEYS = {"lrs": "lr", "ranks": "rank", "heads": "heads", "every": "every",
             "modules_per_block": "modules_per_block", "init_seeds": "init_seed"}
METHOD_DEFAULTS = {"every": 1, "modules_per_block": 1, "init_seed": 0}


def grid_method(cfg: dict) -> str | None:
    """The base method's name: `last_grid.method`, or the first `last` method when null."""
    name = cfg["last_grid"].get("method")
    if name is not None:
        return name
    return next((n for n, m in cfg["methods"].items() if m["kind"] == "last"), None)


def grid_points(cfg: dict) -> list[dict]:
    """Every grid point: {lr, rank, heads, every, modules_per_block, init_seed}, in list order."""
    grid = cfg["last_grid"]
    method = cfg["methods"][grid_method(cfg)]
    base = {**METHOD_DEFAULTS, **{k: v for k, v in method.items() if k in GRID_KEYS.values()}}
    base["lr"] = method.get("lr", cfg["train"]["lr"])
    values = [grid.get(key) or [base[name]] for key, name in GRID_KEYS.items()]
    return [dict(zip(GRID_KEYS.values(), combo)) for combo in itertools.product(*values)]


def point_label(point: dict) -> str:
    """Short name of a grid point, e.g. `lr=0.003,rank=16,heads=4,g=1,T=1,seed=0`."""
    return (f"lr={point['lr']:g},rank={point['rank']},heads={point['heads']},g={point['every']},"
            f"T={point['modules_per_block']},seed={point['init_seed']}")


def point_variant(point: dict) -> str:
    """The metrics `variant` of a grid point (JSON, like the other studies' variants)."""
    return json.dumps({"study": "last_grid", **point}, sort_keys=True)


def check_last_grid_config(cfg: dict) -> None:
    """Semantic checks of an enabled `last_grid:` section (the schema already checked types).

    Raises:
        ConfigError: naming the offending key, e.g. `last_grid.heads`.
    """
    grid = cfg.get("last_grid") or {}
    if not grid.get("enabled"):
        return
    name = grid_method(cfg)
    if name is None:
        raise ConfigError("config key 'last_grid.method': no method of kind 'last' in methods:")
    if name not in cfg["methods"]:
        raise ConfigError(f"config key 'last_grid.method': unknown method '{name}' (methods: {sorted(cfg['methods'])})")
    kind = cfg["methods"][name]["kind"]
    if kind != "last":
        raise ConfigError(f"config key 'last_grid.method': method '{name}' is of kind '{kind}', not 'last'")
    points = grid_points(cfg)
    for p in points:
        if p["rank"] % p["heads"]:
            raise ConfigError(f"config key 'last_grid.heads': heads {p['heads']} do not divide rank {p['rank']} "
                              f"(every combination of last_grid.ranks and last_grid.heads must divide)")
        depth = cfg["backbone"]["arch"]["depth"]
        if cfg["backbone"]["source"] == "pretrain" and depth % p["every"]:
            raise ConfigError(f"config key 'last_grid.every': {p['every']} must divide backbone depth {depth}")
    if len({point_label(p) for p in points}) != len(points):
        raise ConfigError("config key 'last_grid': grid points repeat")


def last_grid_targets(cfg: dict, results: str) -> list[str]:
    """The study's metrics files: one per shard count and seed (none when disabled)."""
    grid = cfg["last_grid"]
    if not grid["enabled"]:
        return []
    name = grid_method(cfg)
    return [f"{results}/metrics/last_grid/{name}/n{n}_s{s}.parquet" for n in grid["shards"] for s in cfg["seeds"]]


def main(args) -> None:
    import time

    import torch

    from pipeline_src.methods.evaluation import classification_metrics
    from pipeline_src.last.grid import train_side_grid
    from pipeline_src.last.train import build_side_network
    from pipeline_src.store.metrics import metric_rows, write_metrics
    from pipeline_src.steps.train import load_job, shard_seed

    job = load_job(args)  # samples, manifest, backbone and settings exactly as the `train` step
    cfg = args.config
    points = grid_points(cfg)
    shard = 0
    model = job.new_model()  # the base SideTuned: its prefix computes features when there is no cache
    t0 = time.perf_counter()
    ids, features, labels = job.shard_data(model, shard)
    members = [{**model.member, "rank": p["rank"], "heads": p["heads"], "every": p["every"],
                "modules_per_block": p["modules_per_block"], "seed": p["init_seed"], "lr": p["lr"],
                "weight_decay": job.settings["weight_decay"]} for p in points]
    backbone = model.backbone
    num_classes = backbone.num_classes
    feats = {f"z{i}": features[:, i] for i in range(features.shape[1])}
    states = train_side_grid(backbone, feats, labels, members, num_classes=num_classes,
                             epochs=job.settings["epochs"], batch_size=job.settings["batch_size"],
                             seed=shard_seed(job.seed, shard))
    print(f"trained {len(members)} side networks of {job.name} n{job.shards} shard {shard} on {len(ids)} samples "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for split in ("val", "test"):
        data = job.store.split("target", split)
        if not data.ids:
            continue
        _, split_feats, split_labels = job.samples_data(model, data.ids)
        for point, member, state in zip(points, members, states):
            model.side = build_side_network(backbone, member, num_classes=num_classes).to(job.device)
            model.load_trainable_state(state)
            model.eval()
            with torch.no_grad():
                logits = torch.cat([model.forward_from_prefix(h) for h in split_feats.split(512)]).cpu()
            values = classification_metrics(logits, split_labels.cpu())
            context = dict(experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method=job.name, kind="last",
                           model=MODEL, variant=point_variant(point), shards=job.shards, shard_id=shard, seed=job.seed,
                           split=split, num_samples=len(data.ids))
            rows += metric_rows(values, context=context, device=job.device, wall_time_s=time.perf_counter() - t0)
            print(f"{point_label(point)} {split}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
    write_metrics(rows, args.output.metrics)  # atomic
