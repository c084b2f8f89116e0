"""Snakemake script of the `unlearn_drop` rule: see pipeline_src/steps/forget/drop.py."""
from pipeline_src.runner.launch import run_step

run_step("forget.drop", snakemake)  # noqa: F821 (injected by Snakemake)
