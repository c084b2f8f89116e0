"""The pretraining pool: backbone images drawn from the training split, disjoint from every target sample.

With `dataset.pretrain_pool` set, the backbone no longer pretrains on held-out *classes*
(`dataset.source_classes`) but on a keyed-hash pool of the training split: a training sample is in
the pool when u = keyed_unit(id, 'pool/<pool seed>') < `fraction`. Pool images of the pool's classes
(`classes`, null: every class) form the source task, split again inside the pool by
v = keyed_unit(id, 'pool-split/<pool seed>') (test if v < test_fraction, val if v < test_fraction +
val_fraction, else train), so the backbone's val and test images come from the pool too. The target
task is the non-pool samples of the classes outside `source_classes`, with their splits as drawn
without the pool: target val and test are the same images with and without a pool, and no target
sample (train, val or test) is ever a pool image. Samples of neither task are dropped.

This is the TAFT paper's near regime (a backbone that saw the target classes, on other images); the
far regime is `source_classes` alone (the backbone never saw a target class). Torch-free.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline_src.plan.sharding import keyed_unit, keyed_units


def pool_key(pool_cfg: dict) -> str:
    """The hash key of pool membership: 'pool/<seed>'."""
    return f"pool/{pool_cfg['seed']}"


def pool_class_names(pool_cfg: dict, order: list[str], class_names: list[str]) -> set[str]:
    """The classes whose pool images pretrain the backbone: `classes` as names (an integer is an idx
    label, named by `dataset.class_names`, else its own string); null: every class.

    Args:
        pool_cfg: `dataset.pretrain_pool`.
        order: the dataset's classes in label order.
        class_names: `dataset.class_names` (idx) or [].
    """
    if pool_cfg.get("classes") is None:
        return set(order)
    return named_classes(pool_cfg["classes"], order, class_names, "dataset.pretrain_pool.classes")


def named_classes(classes: list, order: list[str], class_names: list[str], key: str) -> set[str]:
    """Class names of a config list: a name as given; an integer is a label, named by `class_names`
    when the source has names (idx), else its own string (digits, a folder "3").

    Args:
        classes: the config's list.
        order: the dataset's classes in label order.
        class_names: `dataset.class_names` (idx) or [].
        key: the config key, named in errors.
    """
    out = set()
    for c in classes:
        if isinstance(c, int) and class_names:
            if not 0 <= c < len(class_names):
                raise ValueError(f"config key '{key}': label {c} is not one of 0..{len(class_names) - 1}")
            out.add(class_names[c])
        else:
            out.add(str(c))
    unknown = out - set(order)
    if unknown:
        raise ValueError(f"config key '{key}': classes {sorted(unknown)} not in the dataset (classes: {order})")
    return out


def in_pool(sample_ids: list[str], splits: list[str], pool_cfg: dict) -> np.ndarray:
    """Whether each sample is in the pool: in the training split and u < fraction (boolean array).

    Args:
        sample_ids: the ids.
        splits: each sample's split as drawn (or given) without the pool.
        pool_cfg: `dataset.pretrain_pool`.
    """
    key = pool_key(pool_cfg)
    u = keyed_units(sample_ids, key)
    return (np.asarray(splits, dtype=object) == "train") & (u < pool_cfg["fraction"])


def draw_pool(sample_ids: list[str], class_names: list[str], splits: list[str], pool_cfg: dict,
              pool_classes: set[str], source_classes: set[str]) -> tuple[list[str], list[str], list[int]]:
    """Each kept sample's task and split, and the positions kept.

    Args:
        sample_ids, class_names, splits: the listing, with splits drawn as without a pool.
        pool_cfg: `dataset.pretrain_pool`.
        pool_classes: the classes the backbone pretrains on (`pool_class_names`).
        source_classes: `dataset.source_classes` (names): never in the target task.
    Returns:
        (tasks, splits, keep): per kept sample its task and split, and the kept positions in order.
    """
    pool = in_pool(sample_ids, splits, pool_cfg)
    test_end = pool_cfg["test_fraction"]
    val_end = test_end + pool_cfg["val_fraction"]
    tasks, new_splits, keep = [], [], []
    for k, (i, c, s) in enumerate(zip(sample_ids, class_names, splits)):
        if pool[k]:
            if c not in pool_classes:
                continue
            v = keyed_unit(i, f"pool-split/{pool_cfg['seed']}")
            tasks.append("source")
            new_splits.append("test" if v < test_end else "val" if v < val_end else "train")
        elif c in source_classes:
            continue
        else:
            tasks.append("target")
            new_splits.append(s)
        keep.append(k)
    return tasks, new_splits, keep


def check_disjoint(table: pa.Table, pool_cfg: dict) -> None:
    """Prove on a samples table that the pool and the target task share no sample: ids are unique,
    every source sample is a pool member by its hash, and no target training sample is (target val
    and test are outside the training split the pool is drawn from); source ∩ target ids is empty.

    Args:
        table: a samples table (`samples.SAMPLES_SCHEMA`).
        pool_cfg: `dataset.pretrain_pool`.
    Raises:
        ValueError: naming the first id that breaks it.
    """
    ids = table.column("sample_id").to_pylist()
    tasks = table.column("task").to_pylist()
    splits = table.column("split").to_pylist()
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise ValueError(f"dataset.pretrain_pool: sample id '{dup}' appears twice in the samples table")
    key = pool_key(pool_cfg)
    members = (keyed_units(ids, key) < pool_cfg["fraction"]).tolist()
    for i, t, s, member in zip(ids, tasks, splits, members):
        if t == "source" and not member:
            raise ValueError(f"dataset.pretrain_pool: source sample '{i}' is not in the pool ({key})")
        if t == "target" and s == "train" and member:
            raise ValueError(f"dataset.pretrain_pool: target training sample '{i}' is in the pool ({key})")
    source = {i for i, t in zip(ids, tasks) if t == "source"}
    both = source & {i for i, t in zip(ids, tasks) if t == "target"}
    if both:
        raise ValueError(f"dataset.pretrain_pool: sample id '{min(both)}' is in both the pool and the target task")


def pool_record(table: pa.Table, pool_cfg: dict) -> dict:
    """What the backbone's record says of the pool it saw: its definition, key, classes and counts per
    split. No digest of the members: `backbone.json` travels with every export and a DP study's
    release, and an unkeyed digest lets anyone who guesses the pool confirm it (issue 43). The
    ids themselves go to the private `pretrain/source_ids.txt`; the definition and the samples
    listing recompute them.

    Args:
        table: the samples table.
        pool_cfg: `dataset.pretrain_pool`.
    """
    source = [(i, s, c) for i, t, s, c in zip(table.column("sample_id").to_pylist(), table.column("task").to_pylist(),
                                             table.column("split").to_pylist(), table.column("class_name").to_pylist())
              if t == "source"]
    return {
        "definition": {k: pool_cfg[k] for k in sorted(pool_cfg) if k != "public"},  # a declaration: reruns nothing
        "key": pool_key(pool_cfg),
        "classes": sorted({c for _, _, c in source}),
        "count": len(source),
        "count_per_split": {s: sum(x == s for _, x, _ in source) for s in ("train", "val", "test")},
    }
