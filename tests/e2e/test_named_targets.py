"""Named targets plan their part of the study and nothing downstream (`workflow/rules/targets.smk`).

`backbone` is what `make fashion-backbones` runs before the Fashion studies (issue 42's budget
holds the studies, not the pretraining), so it must build the backbone and its upstream only.
"""
from __future__ import annotations

import re
import shutil

import pytest

from tests.conftest import REPO, snakemake

pytestmark = pytest.mark.e2e


def planned_rules(text: str) -> set[str]:
    """The rules a dry run lists jobs of."""
    return set(re.findall(r"^(?:local)?rule (\w+):", text, flags=re.M))


def test_the_backbone_target_plans_the_pretraining_and_its_inputs_only(tmp_path):
    shutil.copy(REPO / ".test" / "config.yaml", tmp_path / "study.yaml")
    # as `make fashion-backbones` calls it: the target before --configfile, which takes every word after it
    proc = snakemake(tmp_path, "backbone", "-n", "--cores", "2", "--configfile", str(tmp_path / "study.yaml"))
    rules = planned_rules(proc.stdout + proc.stderr)
    assert {"pretrain", "backbone"} <= rules, rules
    assert rules <= {"prepare", "signature", "pretrain", "backbone"}, rules
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("*.safetensors"))
    whole_run = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(tmp_path / "study.yaml"))
    whole = planned_rules(whole_run.stdout + whole_run.stderr)
    assert "train" in whole and "backbone" not in whole  # the default target `all` does not list it
