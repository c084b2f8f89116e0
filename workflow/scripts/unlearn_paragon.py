"""Snakemake script of the `unlearn_paragon` rule: see pipeline_src/steps/unlearn_paragon.py."""
from pipeline_src.launch import run_step

run_step("unlearn_paragon", snakemake)  # noqa: F821 (injected by Snakemake)
