"""Pipeline steps, grouped like the rules (core steps here; fusion/, privacy/, forget/ for the
studies): each module has `main(args: StepArgs)`.

Every rule's `run:` block calls `runner.launch.run_job`, which runs `step_of_rule(rule)`: the
module named like the rule, unless `plan/rule_steps.py` says otherwise.
"""
from __future__ import annotations

from pipeline_src.plan.rule_steps import RULE_STEPS, step_of_rule  # noqa: F401 (the steps' names, read here)
