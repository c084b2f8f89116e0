"""Snakemake script of the `evaluate` rule: see pipeline_src/steps/evaluate.py."""
from pipeline_src.runner.launch import run_step

run_step("evaluate", snakemake)  # noqa: F821 (injected by Snakemake)
