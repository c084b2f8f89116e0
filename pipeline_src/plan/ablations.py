"""The ablation study's plan (`studies.ablations`), importable without torch: variants of one
taft method, each trained on the whole training split and evaluated on test (`steps/ablation.py`).

Ablations of Liu, Soatto et al., "Tangent Transformers for Composition, Privacy and Removal",
ICLR 2024:
- Fig. 2: the loss (RSL, CE, MSE) × PT (pretrained linearization point, T; or reset blocks and
  head, F: `reset`) × CLS (linearize the CLS token too, T: `reset_cls`);
- Table 12: the projection radius R of PGD on Δw (`radius`; none: unconstrained) × the L2 weight
  on ‖Δw‖² (`l2`).
"""
from __future__ import annotations

import json

from pipeline_src.methods.kinds import kind_of
from pipeline_src.plan.errors import ConfigError


def ablation_method(cfg: dict) -> str | None:
    """`studies.ablations.method`, or the first tangent (taft) method when null."""
    name = cfg["studies"]["ablations"]["method"]
    if name is not None:
        return name
    return next((n for n, m in cfg["methods"].items() if kind_of(m).tangent), None)


def _tag(value) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def ablation_points(cfg: dict) -> dict[str, dict]:
    """{label: {"figure", "overrides"}} of every variant, labels path-safe (the `variant` wildcard)."""
    a = cfg["studies"]["ablations"]
    out = {}
    for loss in a["losses"]:
        for pt in (True, False):
            for cls in (False, True):
                label = f"fig2_loss-{loss}_pt-{'T' if pt else 'F'}_cls-{'T' if cls else 'F'}"
                out[label] = {"figure": "fig2", "overrides": {"loss": loss, "reset": not pt, "reset_cls": cls}}
    for r in a["radii"]:
        for l2 in a["l2s"]:
            out[f"table12_r-{_tag(r)}_l2-{_tag(float(l2))}"] = {"figure": "table12",
                                                                 "overrides": {"radius": r, "l2": float(l2)}}
    return out


def point_variant(label: str, point: dict) -> str:
    """The metrics `variant` of one ablation point (JSON)."""
    return json.dumps({"study": "ablation", "figure": point["figure"], "point": label, **point["overrides"]},
                      sort_keys=True)


def check_ablations_config(cfg: dict) -> None:
    """Semantic checks of an enabled `studies.ablations`.

    Raises:
        ConfigError: naming the key.
    """
    a = cfg["studies"]["ablations"]
    if not a["enabled"]:
        return
    name = ablation_method(cfg)
    if name is None or name not in cfg["methods"]:
        raise ConfigError(f"config key 'studies.ablations.method': {name!r} is not a method in `methods:` "
                          f"(and no taft method to default to)")
    if not kind_of(cfg["methods"][name]).tangent:
        raise ConfigError(f"config key 'studies.ablations.method': '{name}' has kind '{cfg['methods'][name]['kind']}'; "
                          f"the ablations of TAFT Fig. 2 and Table 12 need a tangent (taft) method")


def ablation_targets(cfg: dict, results: str) -> list[str]:
    """The study's metrics files: one per variant and seed (none when disabled).

    Args:
        cfg: the validated config.
        results: the results folder.
    """
    if not cfg["studies"]["ablations"]["enabled"]:
        return []
    m = ablation_method(cfg)
    return [f"{results}/metrics/ablation/{m}/{label}/s{s}.parquet" for label in ablation_points(cfg) for s in cfg["seeds"]]
