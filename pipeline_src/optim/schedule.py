"""Learning-rate schedules (`train.schedule`): the factor multiplying a loop's base learning rate
at each optimizer step. Pure arithmetic, no torch (a leaf module of the `optim` library), so every
loop (the shared `fit`, TAFT's and LAST's own and vectorized loops) applies the same function, and
the config checks (`schedule_errors`, called by `plan/config.py`) run at parse time.

- constant: 1.
- step: factor^(number of milestones ≤ the current epoch), milestones in epochs, as
  `torch.optim.lr_scheduler.MultiStepLR` stepped once per epoch. The TAFT paper's schedule
  (Liu, Soatto et al., ICLR 2024, App. A): 30 epochs, lr / 10 at epochs 15 and 25.
- cosine: linear warm-up over `warmup_epochs` (factor (t + 1)/W at step t < W, as `LinearLR`
  with start 1/W), then cosine annealing to `min_factor` over the remaining steps
  (Loshchilov & Hutter 2017, "SGDR"; warm-up: Goyal et al. 2017), as `CosineAnnealingLR`.
"""
from __future__ import annotations

import math

SCHEDULES = ("constant", "step", "cosine")
DEFAULT = {"name": "constant", "milestones": [], "factor": 0.1, "warmup_epochs": 0, "min_factor": 0.0}


def lr_factor(schedule: dict, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """The factor of the base learning rate for optimizer step `step` (0-based).

    Args:
        schedule: `train.schedule` (missing keys take `DEFAULT`).
        step: the step about to be taken.
        steps_per_epoch: optimizer steps per epoch (≥ 1).
        total_steps: steps of the whole run.
    """
    s = {**DEFAULT, **schedule}
    name = s["name"]
    if name == "constant":
        return 1.0
    if name == "step":
        epoch = step // steps_per_epoch
        return float(s["factor"]) ** sum(1 for m in s["milestones"] if m <= epoch)
    if name == "cosine":
        warm = int(round(s["warmup_epochs"] * steps_per_epoch))
        if step < warm:
            return (step + 1) / warm
        span = max(total_steps - warm, 1)
        lo = float(s["min_factor"])
        return lo + (1.0 - lo) * 0.5 * (1.0 + math.cos(math.pi * min(step - warm, span) / span))
    raise ValueError(f"config key 'train.schedule.name': unknown schedule {name!r}; choose one of {SCHEDULES}")


def schedule_errors(schedule: dict, epochs: int, key: str = "train.schedule") -> list[tuple[str, str]]:
    """Problems of a schedule for a run of `epochs`, as (config key, message); [] when fine.

    Args:
        schedule: the schedule settings.
        epochs: the run's epochs.
        key: the config key the schedule came from (for the message).
    """
    s = {**DEFAULT, **schedule}
    out = []
    if s["name"] == "step":
        if not s["milestones"]:
            out.append((f"{key}.milestones", "a step schedule needs at least one milestone (in epochs)"))
        if list(s["milestones"]) != sorted(set(s["milestones"])):
            out.append((f"{key}.milestones", f"{s['milestones']} must increase strictly"))
        late = [m for m in s["milestones"] if m >= epochs]
        if late:
            out.append((f"{key}.milestones", f"{late} not below the {epochs} epochs of the run: never reached"))
    if s["name"] == "cosine" and s["warmup_epochs"] >= epochs:
        out.append((f"{key}.warmup_epochs", f"{s['warmup_epochs']} must be below the {epochs} epochs of the run"))
    return out


def apply_schedule(optimizer, base_lr: float, schedule: dict | None, step: int, steps_per_epoch: int,
                   total_steps: int) -> None:
    """Set every param group's lr of a torch optimizer for `step` (nothing for constant/None).

    Args:
        optimizer: a torch optimizer (duck-typed: `param_groups`).
        base_lr: the loop's configured lr.
        schedule: `train.schedule` or None.
        step, steps_per_epoch, total_steps: as `lr_factor`.
    """
    if not schedule or schedule.get("name", "constant") == "constant":
        return
    lr = base_lr * lr_factor(schedule, step, steps_per_epoch, total_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
