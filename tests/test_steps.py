"""Every rule of the workflow runs through the one shim script, and its step module exists."""
from __future__ import annotations

import importlib
import re

from pipeline_src.steps import step_of_rule
from tests.conftest import REPO


def rules_with_scripts() -> dict[str, str]:
    """Rule name -> its script, read from workflow/rules/*.smk (a rule's block up to the next rule)."""
    out = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        for block in re.split(r"\n(?=\s*rule\b)", text):
            m = re.match(r"\s*rule\s*(\w*):", block)
            script = re.search(r'script:\s*\n\s*"([^"]+)"', block)
            if not m or not script:
                continue
            name = m[1] or "train_vectorized_m_n4_s0"  # rules named in `name:` (one per method, N and seed)
            out[name] = script[1]
    return out


def test_every_rule_runs_the_shim_and_its_step_exists():
    rules = rules_with_scripts()
    assert len(rules) >= 20
    assert set(rules.values()) == {"../scripts/step.py"}
    for rule in rules:
        module = importlib.import_module(f"pipeline_src.steps.{step_of_rule(rule)}")
        assert callable(module.main), rule
    assert sorted(p.name for p in (REPO / "workflow" / "scripts").iterdir() if p.suffix == ".py") == ["step.py"]


def test_step_of_rule():
    assert step_of_rule("train") == "train"
    assert step_of_rule("evaluate_soup") == "evaluate"
    assert step_of_rule("fuse") == "fusion.fuse"
    assert step_of_rule("train_vectorized_last-1_n4") == "train_vectorized"
