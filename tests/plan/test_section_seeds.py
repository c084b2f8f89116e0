"""`fusion.seeds`, `forget.study.seeds`, `privacy.seeds`: side studies at a subset of the study's seeds."""
from __future__ import annotations

import re

import pytest
import yaml

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.forget import unlearning_targets
from pipeline_src.plan.fusion import fusion_targets
from pipeline_src.plan.privacy import private_evaluation_targets
from pipeline_src.plan.section_seeds import section_seeds
from tests.conftest import REPO


def _config(**sections) -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["seeds"] = [0, 1, 2]
    cfg["privacy"] = {"enabled": True, "public_train_size": 100, "methods": ["taft-1"], "regimes": ["fc"],
                      "epsilons": [8]}
    for key, seeds in sections.items():
        node = cfg
        for part in key.split("__"):
            node = node.setdefault(part, {})
        node["seeds"] = seeds
    return validate_config(cfg, count_samples=False)

def _seeds_in(paths: list[str]) -> set[int]:
    """The seeds named in paths' `n<N>_s<seed>` or `s<seed>` folders."""
    return {int(m.group(1)) for p in paths for m in re.finditer(r"(?:^|/|_)s(\d+)(?=/)", p)}


def test_by_default_every_section_runs_at_every_seed():
    cfg = _config()
    assert all(section_seeds(cfg, s) == [0, 1, 2] for s in ("fusion", "forget.study", "privacy"))
    assert _seeds_in(fusion_targets(cfg, "r")) == _seeds_in(unlearning_targets(cfg, "r")) == {0, 1, 2}
    assert _seeds_in(private_evaluation_targets(cfg, "r")) == {0, 1, 2}

def test_a_section_runs_at_its_own_subset_only():
    cfg = _config(fusion=[0], forget__study=[1], privacy=[0, 2])
    assert _seeds_in(fusion_targets(cfg, "r")) == {0}
    assert _seeds_in(unlearning_targets(cfg, "r")) == {1}
    assert _seeds_in(private_evaluation_targets(cfg, "r")) == {0, 2}

def test_a_seed_the_study_does_not_train_is_refused_by_key():
    with pytest.raises(ConfigError, match=r"'privacy\.seeds'.*\[7\]"):
        _config(privacy=[0, 7])
    with pytest.raises(ConfigError, match=r"'forget\.study\.seeds'"):
        _config(forget__study=[3])

def test_an_unknown_section_is_named():
    with pytest.raises(KeyError, match="last_grid"):
        section_seeds(_config(), "last_grid")
