"""Snakemake script of the `last_grid` rule: see pipeline_src/steps/last_grid.py."""
from pipeline_src.runner.launch import run_step

run_step("last_grid", snakemake)  # noqa: F821 (injected by Snakemake)
