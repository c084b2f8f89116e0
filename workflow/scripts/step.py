"""The Snakemake script of every rule: runs the rule's step, `pipeline_src.steps.<step_of_rule(rule)>`."""
from pipeline_src.runner.launch import run_step
from pipeline_src.steps import step_of_rule

run_step(step_of_rule(snakemake.rule), snakemake)  # noqa: F821 (injected by Snakemake)
