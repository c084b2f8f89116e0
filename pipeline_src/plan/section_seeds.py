"""Seeds of one study section (`fusion.seeds`, `forget.study.seeds`, `privacy.seeds`).

The main study trains every method at every seed of `seeds`: the TAFT paper's Tables 1-2 want a
spread over seeds. The side studies (matching and fusion, unlearning, DP) may run at fewer, a
subset of `seeds`, so that a study with three seeds does not triple its most expensive sections.
The unlearning study reuses the main study's shard models, hence the subset.
"""
from __future__ import annotations

from pipeline_src.plan.errors import ConfigError

SECTIONS = ("fusion", "forget.study", "privacy")


def _section(cfg: dict, section: str) -> dict:
    node = cfg
    for part in section.split("."):
        node = node[part]
    return node


def section_seeds(cfg: dict, section: str) -> list[int]:
    """The seeds `section` runs at: its own `seeds` key, or the study's `seeds` where that is null.

    Args:
        cfg: the validated config.
        section: one of `SECTIONS`, dotted (`forget.study`).
    """
    if section not in SECTIONS:
        raise KeyError(f"no seeds key in section {section!r}; sections with one: {', '.join(SECTIONS)}")
    own = _section(cfg, section).get("seeds")
    return list(cfg["seeds"]) if own is None else list(own)


def check_section_seeds(cfg: dict) -> None:
    """Refuse a section's seed that the main study does not train, naming the key."""
    for section in SECTIONS:
        own = _section(cfg, section).get("seeds")
        extra = sorted(set(own or ()) - set(cfg["seeds"]))
        if extra:
            raise ConfigError(f"config key '{section}.seeds': {extra} not in the study's `seeds` {cfg['seeds']}; "
                              f"a section runs at a subset of them")
