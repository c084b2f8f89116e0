"""Where a searched method trains: the point its validation search selected (TAFT App. A, Tables 4-6).

With `search.enabled`, a searched method's name (`taft-1`) stands for the method at its selected
point, at every N and in every side study: its grid points (`plan/search.py`) are the candidates,
each under its own name, and the method's own jobs (train, the vectorized training, the
unlearning, fusion and LAST-grid jobs, DP training) take `results/select/<method>.json` as an
input and a `selected_at` param naming which of its choices applies. The job reads the choice
there and trains at it (`apply_selection`, called for every step by `runner/step_args.py`), and
its model record keeps the point under `method_config.selected`.

The point is known only when `select` has run, while the DAG's wildcards are fixed when it is
built, so the point is an input file, not a wildcard. `select` is a checkpoint: after it runs the
jobs that read its file are built again, and those whose chosen point (`chosen_point`, in their
`selected_at` param) changed rerun, with their dependants; the others do not. Which choice applies
to a job at N shards is fixed at build time (`choice_shards`): the choice at N where the search ran there, else at the searched N nearest
to N on a log scale (ties: the smaller), so N = 25 and 50 train at the N = 10 choice when the
search ran at N = 1 and 10 (the paper's Table 6 chose one point for every shard setting).

Torch-free: the Snakefile's parse runs it, and so does each job (reading the file).
"""
from __future__ import annotations

import json
import math
from typing import Any

from pipeline_src.methods.kinds import kind_of
from pipeline_src.plan.search import method_shards, search_shards, searched_methods, selection_model

# The axes a job takes from the choice: every one for non-private training; for DP training of a
# taft method only CLS, since the DP search picks PT itself (`select_private`) and the DP protocols
# set their own lr (a DP nlft model keeps its own settings: its CLS token is not a DP-checked module).
TRAIN_AXES = ("lr", "pt", "cls")
PRIVATE_AXES = ("cls",)


def selection_base(cfg: dict, name: str) -> str | None:
    """The searched method whose selection `name`'s jobs train at: `name` itself when it is searched,
    the base of a DP search's PT point, else None (a grid point, an unsearched method, no search)."""
    search = cfg.get("search") or {}
    if not search.get("enabled"):
        return None
    variant = (search.get("variants") or {}).get(name)
    if variant is not None:
        base = variant["base"] if variant.get("dp_only") else None
        return base if base in searched_methods(cfg) else None
    return name if name in searched_methods(cfg) else None


def selection_shards(cfg: dict, base: str) -> list[int]:
    """The shard counts at which `select` records a choice for `base` (`plan/search.validation_targets`)."""
    trained = method_shards(cfg, base)
    return [n for n in search_shards(cfg) if n in trained and selection_model(cfg, n) is not None]


def choice_shards(cfg: dict, base: str, shards: int) -> int:
    """The N of the choice that a job of `base` at `shards` trains at: `shards` itself when searched,
    else the searched N nearest on a log scale (ties: the smaller).

    Raises:
        ValueError: `base` has no choice at any N (it trains at no searched N with a selection model).
    """
    chosen = selection_shards(cfg, base)
    if not chosen:
        raise ValueError(f"search: '{base}' is searched but has no selection at any N of search.shards "
                         f"{search_shards(cfg)} (it trains at {method_shards(cfg, base)})")
    return min(chosen, key=lambda n: (abs(math.log(n) - math.log(int(shards))), n))


def selection_file(results: str, base: str) -> str:
    """The `select` record a job of `base` reads."""
    return f"{results}/select/{base}.json"


def selection_inputs(cfg: dict, results: str, name: str) -> dict[str, str]:
    """{"selection": the record} for a job of a method that trains at a selection, else {}."""
    base = selection_base(cfg, name)
    return {"selection": selection_file(results, base)} if base else {}


def selected_at(cfg: dict, name: str, shards: int, axes: tuple[str, ...] = TRAIN_AXES) -> dict[str, Any] | None:
    """A job's `selected_at` param: which method of its settings to move, to which choice; None
    when `name` trains at its own settings.

    Args:
        cfg: the validated config.
        name: the method of the job (its `methods.<name>` settings are moved).
        shards: the N the job's models belong to (a full-data model: 1).
        axes: the grid axes taken from the choice (`TRAIN_AXES`, `PRIVATE_AXES`).
    """
    base = selection_base(cfg, name)
    private = tuple(axes) == PRIVATE_AXES
    if base is None or (base != name and not private):  # a DP search's point trains DP jobs only
        return None
    if private and not kind_of(cfg["methods"][name]).tangent:  # CLS is a DP axis of taft only (DP search)
        return None
    return {"method": name, "base": base, "shards": choice_shards(cfg, base, shards), "axes": list(axes)}


def read_choice(path: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The choice of a `select` record (`steps/select.py`) at `spec["shards"]`.

    Raises:
        ValueError: the record is another method's or has no choice at that N, naming the file.
    """
    with open(path) as fh:
        record = json.load(fh)
    if record.get("method") != spec["base"]:
        raise ValueError(f"selection {path} is the record of '{record.get('method')}', not of '{spec['base']}'")
    for choice in record["choices"]:
        if int(choice["shards"]) == int(spec["shards"]):
            return choice
    raise ValueError(f"selection {path} has no choice at N = {spec['shards']} "
                     f"(it has N = {[c['shards'] for c in record['choices']]})")


def chosen_point(path: str, spec: dict[str, Any]) -> dict[str, Any]:
    """What a job trains at from the choice of record `path` at `spec`: the candidate and its lr,
    PT and CLS (not its validation accuracy, which a retrained candidate moves at the same point)."""
    choice = read_choice(path, spec)
    return {k: choice.get(k) for k in ("candidate", "lr", "pt", "cls")}


def apply_selection(method_cfg: dict, choice: dict[str, Any], spec: dict[str, Any], path: str) -> dict:
    """The method's settings moved to the chosen point on `spec["axes"]` (lr; PT: `reset`; CLS:
    `reset_cls`), with `selected` recording what was read: the file, the candidate, the N it was
    chosen at, its validation accuracy and the axes taken.

    Args:
        method_cfg: the method's settings (`methods.<name>`).
        choice: one choice of the record (`read_choice`).
        spec: the job's `selected_at` param.
        path: the record's path, as the job's input names it.
    """
    if spec.get("point") and {k: choice.get(k) for k in spec["point"]} != spec["point"]:
        raise ValueError(f"selection {path} now chooses {choice['candidate']} at N = {spec['shards']}, but this job "
                         f"was planned at {spec['point']['candidate']}: run the study again to plan it anew")
    out = {**method_cfg}
    axes = list(spec["axes"])
    if "lr" in axes:
        out["lr"] = float(choice["lr"])
    if "pt" in axes and choice.get("pt") is not None:
        out["reset"] = not choice["pt"]
    if "cls" in axes and choice.get("cls") is not None:
        out["reset_cls"] = bool(choice["cls"])
    out["selected"] = {"file": path, "base": spec["base"], "candidate": choice["candidate"],
                       "chosen_at_shards": int(spec["shards"]), "model": choice.get("model"),
                       "val_accuracy": choice.get("val_accuracy"), "axes": axes,
                       "lr": float(choice["lr"]), "pt": choice.get("pt"), "cls": choice.get("cls")}
    return out
