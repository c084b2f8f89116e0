"""The fusion study's plan (config checks and target files), importable without torch.

Zhang et al., "Beyond the Permutation Symmetry of Transformers: The Role of Rotation for
Model Fusion", ICML 2025: shard models are matched to shard 0 (the anchor) by a symmetry of
their parameters (none, permutation, rotation, rotation + scaling), then fused (soup, Fisher,
RegMean). `workflow/rules/fusion.smk` asks this module which files the study has; the steps
are `pipeline_src/steps/{fusion_train,fusion_match,fuse}.py`.

Path layout (`{init}` is `shared`, the study's own shard models, or `random_reinit`, shard
models whose tuned blocks start from per-shard random inits):
    results/fusion_train/{method}/n{N}_s{seed}/shard{i}.safetensors            (random_reinit models)
    results/fusion_match/{init}/{method}/n{N}_s{seed}/{matching}/shard{i}.safetensors
    results/fuse/{init}/{method}/n{N}_s{seed}/{matching}/{fusion}.safetensors
    results/metrics/fusion_match/{init}/{method}/n{N}_s{seed}/{matching}.parquet
    results/metrics/fuse/{init}/{method}/n{N}_s{seed}/{matching}/{fusion}.parquet
"""
from __future__ import annotations

import json

from pipeline_src.methods.kinds import kind_of, kinds_where
from pipeline_src.methods.kinds import matchable_blocks as blocks_of_kind
from pipeline_src.plan.errors import ConfigError
from pipeline_src.plan.search import is_variant
from pipeline_src.plan.section_seeds import section_seeds

MATCHINGS = ("none", "permutation", "rotation", "rotation-scaling")
INITS = ("shared", "random_reinit")
FUSIONS = ("soup", "fisher", "regmean")
KINDS = kinds_where("fusable")  # the kinds whose shard models have attention to match


class FusionConfigError(ConfigError):
    """A `fusion:` section that the study cannot run (names the dotted key)."""


def fusion_methods(cfg: dict) -> list[str]:
    """Method names of the study: `fusion.methods`, or every nlft/last method when empty."""
    names = cfg["fusion"]["methods"]
    return list(names) if names else [n for n, m in cfg["methods"].items()
                                      if kind_of(m).fusable and not is_variant(cfg, n)]


def fusion_shards(cfg: dict) -> list[int]:
    """Shard counts of the study: `fusion.shards`, or every N > 1 of `shards` when empty."""
    chosen = cfg["fusion"]["shards"]
    return list(chosen) if chosen else [n for n in cfg["shards"] if n > 1]


def matchable_blocks(cfg: dict, method_cfg: dict) -> int | None:
    """How many blocks matching can touch (nlft: k; last: LSA blocks), None when unknown at
    parse time (a timm or checkpoint backbone's depth)."""
    depth = cfg["backbone"]["arch"]["depth"] if cfg["backbone"]["source"] == "pretrain" else None
    return blocks_of_kind(method_cfg, depth)


def check_fusion_config(cfg: dict) -> None:
    """Semantic checks of an enabled `fusion:` section (the schema already checked types).

    Raises:
        FusionConfigError: naming the offending key, e.g. `fusion.methods`.
    """
    fus = cfg["fusion"]
    if not fus["enabled"]:
        return
    for name in fus["methods"]:
        if name not in cfg["methods"]:
            raise FusionConfigError(f"config key 'fusion.methods': '{name}' is not a method in 'methods'")
        kind = cfg["methods"][name]["kind"]
        if not kind_of(kind).fusable:
            raise FusionConfigError(f"config key 'fusion.methods': method '{name}' has kind '{kind}'; "
                                    f"matching and fusion support kinds {list(KINDS)} only")
    if not fusion_methods(cfg):
        raise FusionConfigError("config key 'fusion.methods': no method of kind nlft or last to fuse")
    for n in fus["shards"]:
        if n not in cfg["shards"] or n < 2:
            raise FusionConfigError(f"config key 'fusion.shards': {n} must be one of the study's shard counts "
                                    f"{cfg['shards']} and at least 2")
    if not fusion_shards(cfg):
        raise FusionConfigError("config key 'fusion.shards': the study has no shard count > 1 to fuse")
    if fus["blocks"] is not None:
        for name in fusion_methods(cfg):
            n = matchable_blocks(cfg, cfg["methods"][name])
            bad = [b for b in fus["blocks"] if n is not None and not -n <= b < n]
            if bad:
                raise FusionConfigError(f"config key 'fusion.blocks': positions {bad} out of range for method "
                                        f"'{name}', which has {n} matchable blocks")


def variant(cfg: dict, init: str, matching: str, **extra) -> str:
    """The metrics rows' `variant` JSON: everything that identifies a fusion-study row."""
    fus = cfg["fusion"]
    return json.dumps({"study": "fusion", "init": init, "matching": matching, "match_ffn": fus["match_ffn"],
                       "blocks": fus["blocks"], **({"head_permutation": True} if fus.get("head_permutation") else {}),
                       **extra}, sort_keys=True)


def fusion_targets(cfg: dict, results: str = "results") -> list[str]:
    """Every metrics file of the study (empty when `fusion.enabled` is false)."""
    fus = cfg["fusion"]
    if not fus["enabled"]:
        return []
    out = []
    for method in fusion_methods(cfg):
        for n in fusion_shards(cfg):
            for seed in section_seeds(cfg, "fusion"):
                for init in fus["inits"]:
                    base = f"n{n}_s{seed}"
                    for matching in fus["matching"]:
                        out.append(f"{results}/metrics/fusion_match/{init}/{method}/{base}/{matching}.parquet")
                        out += [f"{results}/metrics/fuse/{init}/{method}/{base}/{matching}/{f}.parquet"
                                for f in fus["fusions"]]
    return out
