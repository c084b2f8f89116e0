"""Which shard models train in one vectorized job per (method, N, seed), and which in per-shard
`train` jobs (workflow/rules/train.smk), at DAG-build time without torch.

- A method's `vectorized_shards` (true, false or auto) says whether its first training of N
  shards is one job (`steps/train_vectorized.py`). `auto` picks it where the benchmark
  (benchmarks/bench_vectorized_shards.py, README "Training shards together") found it pays.
- The vectorized job trains the shards that no forget request touches; a touched shard
  retrains alone in a per-shard job, and only it. The vectorized job's outputs are exactly the
  untouched shards' files, and the per-shard rule is kept off them (`train_method_constraint`),
  so no file has two rules. Its inputs keep all N manifests in shard order, the touched ones as
  `ancient` (workflow/rules/common.smk): a new request changes neither its inputs nor its
  params, so the untouched shards do not rerun.
"""
from __future__ import annotations

import re

from pipeline_src.methods.kinds import kind_of
from pipeline_src.plan.forget import forgotten_in_shard, shard_members

VECTORIZED_KINDS = ("fc", "nlft", "last", "taft")  # kinds with a vectorized path (not full: no cache)
# `auto`: measured on the 2-core CPU (README "Training shards together"): stacked training beat
# N separate trainings, start costs aside, for every measured shard size up to this one.
AUTO_MAX_SHARD_SIZE = 400


def is_vectorized(cfg: dict, method: str, shards: int) -> bool:
    """Whether the first training of `method` at N = `shards` is one vectorized job.

    Args:
        cfg: the validated config.
        method: a key of `methods`.
        shards: N.
    """
    setting = cfg["methods"][method].get("vectorized_shards", False)
    if not setting or kind_of(cfg["methods"][method]).name not in VECTORIZED_KINDS:
        return False
    if setting == "auto":
        if shards < 2:
            return False
        unforgotten = {**cfg, "forget": {**cfg["forget"], "requests": None}}  # a request must not flip the choice
        largest = max(len(shard_members(unforgotten, shards, s, i)) for s in cfg["seeds"] for i in range(shards))
        return largest <= AUTO_MAX_SHARD_SIZE
    return True


def vectorized_shards(cfg: dict, method: str, shards: int, seed: int) -> list[int]:
    """The shards the vectorized job of (method, N, seed) trains: those no forget request touches
    ([] when the method trains per shard at this N)."""
    if not is_vectorized(cfg, method, shards):
        return []
    return [i for i in range(shards) if not forgotten_in_shard(cfg, shards, seed, i)]


def vectorized_jobs(cfg: dict) -> list[tuple[str, int, int, list[int]]]:
    """(method, N, seed, shards) of every vectorized training job of the study (`shards` config x
    `seeds`), one per (method, N, seed) with at least one untouched shard."""
    out = []
    for method in cfg["methods"]:
        for n in cfg["shards"]:
            for seed in cfg["seeds"]:
                trained = vectorized_shards(cfg, method, n, seed)
                if trained:
                    out.append((method, n, seed, trained))
    return out


def train_method_constraint(methods: list[str], jobs: list[tuple[str, int, int, list[int]]]) -> str:
    """The `method` wildcard constraint of the per-shard `train` rule: any method, except on the
    files the vectorized jobs write (a lookahead over the rest of the path
    `{method}/n{N}_s{seed}/shard{i}.<ext>`).

    Args:
        methods: every method name.
        jobs: `vectorized_jobs(cfg)`.
    """
    names = "|".join(re.escape(m) for m in methods) or "(?!)"
    if not jobs:
        return f"(?:{names})"
    taken = "|".join(f"{re.escape(m)}/n{n}_s{s}/shard(?:{'|'.join(map(str, idx))})\\." for m, n, s, idx in jobs)
    return f"(?!(?:{taken}))(?:{names})"
