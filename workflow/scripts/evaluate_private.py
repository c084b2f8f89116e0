"""Snakemake script of the `evaluate_private` rule: see pipeline_src/steps/privacy/evaluate.py."""
from pipeline_src.runner.launch import run_step

run_step("privacy.evaluate", snakemake)  # noqa: F821 (injected by Snakemake)
