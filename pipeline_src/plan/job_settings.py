"""A training job's settings: the one place the study's `train:` block and a method's own keys merge.

Torch-free: the rules build each training job's signature from it at parse time
(`workflow/rules/inputs.smk`, `signature_of`), and the job reads the same merge at run time
(`steps/train.py`), so what a signature covers is exactly what the job uses.
"""
from __future__ import annotations

import json


def train_settings(cfg: dict, method_cfg: dict) -> dict:
    """The study's `train:` settings, each overridden by the method's own key of that name.

    Args:
        cfg: the validated config.
        method_cfg: the method's settings (`methods.<name>`, or settings standing in for them).
    """
    return {k: method_cfg.get(k, v) for k, v in cfg["train"].items()}


# How a run's seed reaches a model's random init: the head, the PT = F reset (TAFT) and the LAST side
# network are drawn from `init_seed(config seed, run seed)`, one value for every shard of a run (soups and
# the TAFT Δw sum need one start), another for each run seed. Named in every training signature, so
# results trained under an older rule (one init for every run seed) rerun.
INIT_RULE = "config seed + 7919 x run seed"
INIT_STRIDE = 7919  # a prime, so the study's first run seed (0) keeps the config seed's init


def init_seed(config_seed: int, run_seed: int) -> int:
    """The random-init seed of every model of one run (head, reset, side network; `INIT_RULE`).

    Args:
        config_seed: the study's `seed`.
        run_seed: the run's seed (the `seed` wildcard, one of `seeds`).
    """
    return int(config_seed) + INIT_STRIDE * int(run_seed)


# How a job reads its data, not what it computes (trained tensors are bit-identical at any value:
# tests/steps/test_train_from_images.py; eval_batch_size is used only by evaluation), so changing it reruns nothing.
RUN_ONLY = ("num_workers", "eval_batch_size")


def training_signature(cfg: dict, method_cfg: dict) -> str:
    """Canonical JSON of everything that determines a trained model besides its input files,
    so editing a method's settings reruns exactly its jobs (and reordering keys reruns nothing).

    Args:
        cfg: the validated config.
        method_cfg: the method's settings.
    """
    settings = {k: v for k, v in train_settings(cfg, method_cfg).items() if k not in RUN_ONLY}
    return json.dumps({"method": method_cfg, "train": settings, "head_seed": cfg["seed"], "init_seeds": INIT_RULE},
                      sort_keys=True)
