"""Which shard models train in one vectorized job per (method, N, seed), and which in per-shard
`train` jobs (workflow/rules/train.smk), at DAG-build time without torch.

- A method's `vectorized_shards` (true, false or auto, the default) says whether its first
  training of N shards is one job (`steps/train_vectorized.py`). `auto` picks it where the
  benchmark found it pays (`auto_pays`).
- The vectorized job trains the shards that no forget request touches; a touched shard
  retrains alone in a per-shard job, and only it. The vectorized job's outputs are exactly the
  untouched shards' files, and the per-shard rule is kept off them (`train_method_constraint`),
  so no file has two rules. Its inputs keep all N manifests in shard order, the touched ones as
  `ancient` (workflow/rules/inputs.smk): a new request changes neither its inputs nor its
  params, so the untouched shards do not rerun.
- `features.cache: auto` on a GPU keeps the cache exactly when some method's shards vectorize
  (`resolve_auto_cache`), so a study plans the same jobs with `device: cuda` as on the CPU.
"""
from __future__ import annotations

import re

from pipeline_src.methods.kinds import kind_of
from pipeline_src.plan.forget import forgotten_in_shard, samples_table, train_count
from pipeline_src.plan.search import method_shards

DEFAULT = "auto"


def auto_pays(shards: int, mean_shard_size: float, tuned_blocks: int = 1, tangent: bool = False) -> bool:
    """`auto`'s rule, from benchmarks/bench_vectorized_shards.py on the 2-core CPU (README "Training
    shards together"): stacked training took 0.1-1.0x the compute of N separate trainings, and saves
    N - 1 job starts (~0.6 s each), except at N = 2-4 with 200-400-sample shards (nlft, taft:
    1.1-1.4x; over 30 epochs that loses more than the starts saved). Larger shards were not
    measured: per-shard jobs there.

    A tuned part of more than one block (nlft-k, taft-k, k >= 2) stacks worse: every stacked block
    runs the written-out attention and batched products. Measured at k = 2 and 4 (2026-11-29): nlft
    1.21-1.66x at every point (N 2-10, 53-264 a shard); taft 0.73-1.02x at 53 a shard, 0.91-1.41x
    at 132-264. So those vectorize only as taft, and only with shards of <= 64 samples.

    Args:
        shards: N.
        mean_shard_size: training samples / N.
        tuned_blocks: the method's k (blocks tuned or linearized); 1 for the kinds without blocks.
        tangent: the method is a tangent (taft) model.
    """
    if shards < 2:
        return False
    if tuned_blocks > 1:
        return tangent and mean_shard_size <= 64
    return mean_shard_size <= 200 or (shards >= 10 and mean_shard_size <= 400)


def is_vectorized(cfg: dict, method: str, shards: int) -> bool:
    """Whether the first training of `method` at N = `shards` is one vectorized job.

    Args:
        cfg: the validated config.
        method: a key of `methods`.
        shards: N.
    """
    method_cfg = cfg["methods"][method]
    setting, kind = method_cfg.get("vectorized_shards", DEFAULT), kind_of(method_cfg)
    if not setting or not kind.vectorized:
        return False
    if setting == "auto":
        if not kind.auto_vectorized or shards < 2 or cfg["train"]["augment"]["enabled"] or not cfg["features"]["cache"]:
            return False  # augmentation needs per-shard jobs; auto was measured from cached features
        # Without forget requests (a request must not flip the choice) each seed's N shards partition the
        # training split, so the mean shard size is n / N: no manifests to draw (168 calls in the Fashion study).
        return auto_pays(shards, train_count(samples_table(cfg)) / shards,
                         method_cfg["k"] if kind.tuned_blocks else 1, kind.tangent)
    return True


def resolve_auto_cache(cfg: dict) -> None:
    """Settle `features.cache: auto` with `device: cuda` (validation set it true there provisionally,
    false under augmentation): keep the cache when a method's shards train vectorized from it,
    otherwise recompute the prefix on every batch (cheaper to recompute than to read on a GPU for
    per-shard jobs: config schema, `features.cache`).

    Why not vectorize from images instead: the vectorized job would run the frozen prefix on every
    sample of every shard in every epoch, (epochs x seeds x N-values x methods) times, where the
    cache runs it once per prefix depth; the trained part (k blocks and the head, forward and
    backward) is a fraction of the prefix's forward at k = 1 (docs/performance.md, "Vectorized
    shards on a GPU").

    Args:
        cfg: the validated config, `features.cache` already true or false; changed in place.
    """
    if cfg["device"] == "cuda" and cfg["features"]["cache"]:
        cfg["features"]["cache"] = bool(vectorized_jobs(cfg))


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
        for n in method_shards(cfg, method):
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
