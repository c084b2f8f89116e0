"""Snakemake script of the `unlearn_retrain` rule: see pipeline_src/steps/unlearn_retrain.py."""
from pipeline_src.launch import run_step

run_step("unlearn_retrain", snakemake)  # noqa: F821 (injected by Snakemake)
