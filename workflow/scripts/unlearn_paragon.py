"""Snakemake script of the `unlearn_paragon` rule: see pipeline_src/steps/forget/paragon.py."""
from pipeline_src.runner.launch import run_step

run_step("forget.paragon", snakemake)  # noqa: F821 (injected by Snakemake)
