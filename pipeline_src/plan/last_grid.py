"""The LAST grid study's plan (config checks, grid points, target files), importable without torch.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning" (LAST), arXiv:2402.04009, 2024. The base is a `last` method of `methods:` (config
`last_grid.method`); each list of `last_grid` (lrs, ranks, heads, every, modules_per_block,
bias_corrections, init_seeds) replaces one of its settings, an empty list keeps the method's value, and the grid
is their product. The job is `pipeline_src/steps/last_grid.py`.
"""
from __future__ import annotations

import itertools
import json

from pipeline_src.methods.kinds import LAST_DEFAULTS, kind_of
from pipeline_src.plan.errors import ConfigError

# last_grid list key -> the base method's key it replaces (and its default there).
GRID_KEYS = {"lrs": "lr", "ranks": "rank", "heads": "heads", "every": "every",
             "modules_per_block": "modules_per_block", "bias_corrections": "bias_correction",
             "init_seeds": "init_seed"}
METHOD_DEFAULTS = {**LAST_DEFAULTS, "bias_correction": True, "init_seed": 0}


def grid_method(cfg: dict) -> str | None:
    """The base method's name: `last_grid.method`, or the first `last` method when null."""
    name = cfg["last_grid"].get("method")
    if name is not None:
        return name
    return next((n for n, m in cfg["methods"].items() if kind_of(m).side), None)


def grid_points(cfg: dict) -> list[dict]:
    """Every grid point: {lr, rank, heads, every, modules_per_block, bias_correction, init_seed}, in list order."""
    grid = cfg["last_grid"]
    method = cfg["methods"][grid_method(cfg)]
    base = {**METHOD_DEFAULTS, **{k: v for k, v in method.items() if k in GRID_KEYS.values()}}
    base["lr"] = method.get("lr", cfg["train"]["lr"])
    values = [grid.get(key) or [base[name]] for key, name in GRID_KEYS.items()]
    return [dict(zip(GRID_KEYS.values(), combo)) for combo in itertools.product(*values)]


def point_label(point: dict) -> str:
    """Short name of a grid point, e.g. `lr=0.003,rank=16,heads=4,g=2,T=2,bc=1,seed=0`."""
    return (f"lr={point['lr']:g},rank={point['rank']},heads={point['heads']},g={point['every']},"
            f"T={point['modules_per_block']},bc={int(point['bias_correction'])},seed={point['init_seed']}")


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
    if not kind_of(kind).side:
        raise ConfigError(f"config key 'last_grid.method': method '{name}' is of kind '{kind}', not 'last'")
    if cfg["methods"][name].get("ffn_hidden", 0):
        raise ConfigError(f"config key 'last_grid.method': method '{name}' has an FFN (ffn_hidden); the grid's "
                          f"vectorized low-rank forward covers the paper's LSA without FFN only")
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
