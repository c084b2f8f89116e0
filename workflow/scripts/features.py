"""Snakemake script of the `features` rule: see pipeline_src/steps/features.py."""
from pipeline_src.runner.launch import run_step

run_step("features", snakemake)  # noqa: F821 (injected by Snakemake)
