"""Snakemake script of the `evaluate_private` rule: see pipeline_src/steps/evaluate_private.py."""
from pipeline_src.launch import run_step

run_step("evaluate_private", snakemake)  # noqa: F821 (injected by Snakemake)
