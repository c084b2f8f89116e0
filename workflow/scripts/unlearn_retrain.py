"""Snakemake script of the `unlearn_retrain` rule: see pipeline_src/steps/forget/retrain.py."""
from pipeline_src.runner.launch import run_step

run_step("forget.retrain", snakemake)  # noqa: F821 (injected by Snakemake)
