"""Which step module (below `pipeline_src.steps`) runs a rule's jobs: the module named like the
rule, unless the table below says otherwise. Torch-free: the launcher (`runner/launch.py`), in
Snakemake's own process, and the tests read it.
"""
from __future__ import annotations

from pipeline_src.plan.step_settings import VECTORIZED_RULE  # one rule per method and N: train_vectorized_{method}_n{N}

# rule name -> step module below pipeline_src.steps, where they differ
RULE_STEPS = {
    "evaluate_shards": "evaluate", "evaluate_soup": "evaluate", "validate": "evaluate",
    "validate_private": "privacy.evaluate", "select_private": "select",
    "fusion_train": "fusion.train", "fusion_match": "fusion.match", "fuse": "fusion.fuse",
    "train_private": "privacy.train", "compose_private": "privacy.compose", "evaluate_private": "privacy.evaluate",
    "release": "privacy.release",
    "forget_manifest": "forget.manifest", "unlearn_drop": "forget.drop", "unlearn_retrain": "forget.retrain",
    "unlearn_paragon": "forget.paragon", "unlearn_paragon_nonlinear": "forget.paragon",
}


def step_of_rule(rule: str) -> str:
    """The step module (below `pipeline_src.steps`) that runs a rule's jobs."""
    if rule.startswith(VECTORIZED_RULE):
        return "train_vectorized"
    return RULE_STEPS.get(rule, rule)
