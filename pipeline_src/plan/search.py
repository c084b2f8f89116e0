"""The `search:` section: the TAFT paper's validation search (App. A, Tables 4-6) as methods of the DAG.

Each searched method is expanded at validation into one method per grid point: the learning
rates `search.lrs` for every kind, times CLS (`search.nlft.cls`: true = `reset_cls`) for nlft (the
paper's Table 4 chose CLS for NLFT-1), times PT (`search.taft.pt`: false = `reset`) and CLS
(`search.taft.cls`) for taft. A point is a method of `methods:` like any other, so it trains,
composes and is validated through the ordinary rules, and editing one point reruns only its jobs.
Every point has its own name, `<method>_lr<lr>[_cls<T|F>|_pt<T|F>_cls<T|F>]`
(`taft-1_lr1e-4_ptF_clsT`, `nlft-1_lr1e-3_clsT`): the method's own name stands for the method at
its selected point, which its jobs read at run time (`plan/selected_point.py`).

The points are recorded in `search.variants` (name -> base, lr, pt, cls), which the studies that
default to "every method of a kind" (fusion, privacy) skip: they keep studying the methods the
user named, at their selected points. Torch-free: the Snakefile's parse runs it.
"""
from __future__ import annotations

import copy
import itertools
from typing import Any

from pipeline_src.methods.kinds import kind_of, kinds_where
from pipeline_src.plan.errors import ConfigError

SEARCHED_KINDS = kinds_where("searched")


def lr_tag(lr: float) -> str:
    """How a learning rate appears in a point's name: 0.001 -> '1e-3', 0.0003 -> '3e-4', 0.5 -> '5e-1'."""
    mantissa, exponent = f"{float(lr):e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".").replace(".", "p")
    return f"{mantissa}e{int(exponent)}"


def _flag(value: bool) -> str:
    return "T" if value else "F"


def point_name(base: str, lr: float, pt: bool | None, cls: bool | None) -> str:
    """A grid point's method name."""
    name = f"{base}_lr{lr_tag(lr)}"
    if pt is not None:
        return f"{name}_pt{_flag(pt)}_cls{_flag(cls)}"
    return name if cls is None else f"{name}_cls{_flag(cls)}"


def searched_methods(cfg: dict) -> list[str]:
    """`search.methods`, or every base method of a searched kind when it is empty (config order)."""
    variants = cfg["search"].get("variants") or {}
    names = cfg["search"]["methods"]  # a DP search's points (dp_only) are never searched again
    if names:
        return list(names)
    return [n for n, m in cfg["methods"].items() if kind_of(m).searched and n not in variants]


def search_shards(cfg: dict) -> list[int]:
    """The shard counts where the grid points train and selection is made."""
    return list(cfg["search"]["shards"]) or list(cfg["shards"])


def _axes(cfg: dict, method: dict) -> tuple[list, list]:
    """The PT and CLS values searched for one method: taft both (`search.taft`), nlft CLS
    (`search.nlft`), other kinds neither ([None])."""
    search, kind = cfg["search"], kind_of(method)
    if kind.tangent:
        return search["taft"]["pt"], search["taft"]["cls"]
    if kind.reset_cls:
        return [None], search[kind.name]["cls"]
    return [None], [None]


def grid(cfg: dict, base: str) -> list[dict[str, Any]]:
    """The points of one searched method, in grid order: {name, lr, pt, cls, kind, k} (pt None but
    for taft, cls None but for taft and nlft; k None but for nlft and taft)."""
    method = cfg["methods"][base]
    pts, clss = _axes(cfg, method)
    return [{"name": point_name(base, lr, pt, cls), "lr": float(lr), "pt": pt, "cls": cls, "kind": method["kind"],
             "k": method.get("k")} for lr, pt, cls in itertools.product(cfg["search"]["lrs"], pts, clss)]


def point_settings(method: dict, point: dict[str, Any]) -> dict:
    """A base method's settings moved to a grid point."""
    out = {**method, "lr": point["lr"]}
    if point["pt"] is not None:
        out["reset"] = not point["pt"]
    if point["cls"] is not None:
        out["reset_cls"] = bool(point["cls"])
    return out


def expand_search(cfg: dict) -> None:
    """Add every grid point of `search:` to `cfg["methods"]` and record them in `search.variants`
    (in place; a config expanded before is expanded again from its base methods).

    Args:
        cfg: the config after the schema's defaults are filled in.

    Raises:
        ConfigError: a searched method that is not in `methods:` or of no searched kind, a search
            shard count not in `shards`, a point whose name a method already has, or a
            `search.variants` other than validation's own (`_check_given_variants`).
    """
    search = cfg["search"]
    old = copy.deepcopy(search.get("variants") or {})
    given = {name: cfg["methods"].pop(name) for name in old if name in cfg["methods"]}  # back to the base methods
    if old and "privacy" in cfg:  # and the privacy study's lists to the methods named by hand
        cfg["privacy"]["methods"] = [m for m in cfg["privacy"]["methods"] if m not in old]
        cfg["privacy"]["paper"]["methods"] = [m for m in cfg["privacy"]["paper"]["methods"] if m not in old]
    if old:
        _check_given_variants(cfg, old, given)
    search["variants"] = {}
    if search["enabled"]:
        _expand(cfg)


def _check_given_variants(cfg: dict, old: dict, given: dict) -> None:
    """`search.variants` in a config is validation's own record only (a validated config given back,
    each point with its method in `methods:`), whose points are then derived again from the search's
    settings. An entry set by hand (no such method, or one with other settings) would be silently
    dropped: refuse it, naming it.

    Args:
        cfg: the config, its grid points' methods taken out.
        old: the `search.variants` the config came with.
        given: the methods of those names it came with.
    """
    for name, entry in old.items():
        base = cfg["methods"].get(entry["base"])
        if name not in given:
            why = "no method of that name in `methods:` (validation adds one with each point)"
        elif base is None:
            why = f"its base '{entry['base']}' is not a method of `methods:`"
        elif given[name] != ({**base, "reset": not entry.get("pt")} if entry.get("dp_only") else
                             point_settings(base, {"lr": entry["lr"], "pt": entry.get("pt"), "cls": entry.get("cls")})):
            why = f"methods.{name} is not the point of '{entry['base']}' it describes"
        else:
            continue
        raise ConfigError(f"config key 'search.variants.{name}': {why}. `search.variants` is filled in by validation "
                          "from the search's settings, never set by hand: to train a point, add it to search.lrs, "
                          "search.taft or search.privacy_pt, or name a method of its own in `methods:`, and leave "
                          "`search.variants` out")


def _expand(cfg: dict) -> None:
    """`expand_search` of an enabled search (`search.variants` emptied)."""
    search = cfg["search"]
    for i, name in enumerate(search["methods"]):
        if name not in cfg["methods"]:
            raise ConfigError(f"config key 'search.methods[{i}]': '{name}' is not a method of `methods:`")
        if not kind_of(cfg["methods"][name]).searched:
            raise ConfigError(f"config key 'search.methods[{i}]': '{name}' is of kind "
                              f"'{cfg['methods'][name]['kind']}', not one the search covers ({', '.join(SEARCHED_KINDS)})")
    for i, n in enumerate(search["shards"]):
        if n not in cfg["shards"]:
            raise ConfigError(f"config key 'search.shards[{i}]': {n} is not one of `shards` {cfg['shards']}")
    added: dict[str, dict] = {}
    for base in searched_methods(cfg):
        for point in grid(cfg, base):
            if point["name"] in cfg["methods"] or point["name"] in added:
                raise ConfigError(f"config key 'methods.{point['name']}': the name of a grid point of "
                                  f"search over '{base}'; rename the method")
            added[point["name"]] = point_settings(cfg["methods"][base], point)
            search["variants"][point["name"]] = {"base": base, "lr": point["lr"], "pt": point["pt"],
                                                 "cls": point["cls"]}
    cfg["methods"].update(added)
    if cfg["privacy"]["enabled"]:
        _expand_privacy_pt(cfg)


def _expand_privacy_pt(cfg: dict) -> None:
    """The paper's DP search (PT ∈ {T, F}): each taft method of the privacy study gets its other PT
    as a method that only the privacy study trains (`dp_only`), added to the study's method lists."""
    p, search = cfg["privacy"], cfg["search"]
    # `privacy.methods` resolved before the points join `methods:` (as plan/privacy.privacy_methods)
    studied = list(p["methods"]) or [n for n, m in cfg["methods"].items()
                                     if kind_of(m).private and not is_variant(cfg, n)]
    bases = [m for m in dict.fromkeys([*studied, *p["paper"]["methods"]]) if kind_of(cfg["methods"][m]).tangent]
    added = {}
    for base in bases:
        method = cfg["methods"][base]
        own = not method.get("reset", False)
        for pt in search["privacy_pt"]:
            if pt == own:
                continue
            name = f"{base}_dp_pt{_flag(pt)}"
            if name in cfg["methods"]:
                raise ConfigError(f"config key 'methods.{name}': the name of the DP search's PT point of "
                                  f"'{base}'; rename the method")
            added[name] = {**method, "reset": not pt}
            search["variants"][name] = {"base": base, "lr": float(method.get("lr", cfg["train"]["lr"])), "pt": pt,
                                        "cls": bool(method.get("reset_cls", False)), "dp_only": True}
            if base in studied:
                studied.append(name)
            if base in p["paper"]["methods"]:
                p["paper"]["methods"] = [*p["paper"]["methods"], name]
    cfg["methods"].update(added)
    p["methods"] = studied if added else p["methods"]


def dp_candidates(cfg: dict, base: str) -> list[dict[str, Any]]:
    """The DP search's points of one taft method: {name, lr, pt, cls, kind, k}, in `privacy_pt` order."""
    method = cfg["methods"][base]
    own = not method.get("reset", False)
    lr = float(method.get("lr", cfg["train"]["lr"]))
    return [{"name": base if pt == own else f"{base}_dp_pt{_flag(pt)}", "lr": lr, "pt": pt,
             "cls": bool(method.get("reset_cls", False)), "kind": method["kind"], "k": method.get("k")}
            for pt in cfg["search"]["privacy_pt"]]


def is_variant(cfg: dict, name: str) -> bool:
    """Whether `name` is a grid point added by the search (not a method the user named)."""
    return name in (cfg.get("search", {}).get("variants") or {})


def method_shards(cfg: dict, name: str) -> list[int]:
    """The shard counts a method trains at: its own `shards` (default: the study's); a search's grid
    point only at those of them the search runs at, a DP search's point at none (only the privacy
    study trains it)."""
    own = cfg["methods"][name].get("shards")
    trained = list(cfg["shards"]) if own is None else [n for n in cfg["shards"] if n in own]
    if not is_variant(cfg, name):
        return trained
    if cfg["search"]["variants"][name].get("dp_only"):
        return []
    return [n for n in search_shards(cfg) if n in trained]


def selection_model(cfg: dict, shards: int) -> str | None:
    """The model selection compares at N shards: the full-data model at N = 1, else the soup (the
    composed model of TAFT Table 6), else the ensemble; None when the study composes nothing."""
    if shards == 1:
        return "shard"
    comps = cfg["compositions"]
    return "soup" if "soup" in comps else "ensemble" if "ensemble" in comps else None


def selection_points(cfg: dict) -> dict[str, list[dict[str, Any]]]:
    """Each searched base method's candidates (its grid points, in grid order): the `select` job's
    param, so adding or editing a point reruns that method's selection only."""
    if not cfg["search"]["enabled"]:
        return {}
    return {base: grid(cfg, base) for base in searched_methods(cfg)}


def validation_targets(cfg: dict, results: str, base: str) -> list[str]:
    """The validation metrics files the selection of `base` reads: every candidate, searched N
    with a selection model, and seed (`results/validate/<method>/n<N>_s<seed>/<model>.parquet`)."""
    out = []
    for point in grid(cfg, base):
        trained = method_shards(cfg, point["name"])
        for n in (n for n in search_shards(cfg) if n in trained):
            model = selection_model(cfg, n)
            if model is None:
                continue
            out += [f"{results}/validate/{point['name']}/n{n}_s{s}/{model}.parquet" for s in cfg["seeds"]]
    return out


def selection_targets(cfg: dict, results: str) -> list[str]:
    """The `select` outputs of the study: one record per searched method (empty without search)."""
    return [f"{results}/select/{base}.parquet" for base in selection_points(cfg)]
