"""Snakemake script of the `compose` rule: see pipeline_src/steps/compose.py."""
from pipeline_src.runner.launch import run_step

run_step("compose", snakemake)  # noqa: F821 (injected by Snakemake)
