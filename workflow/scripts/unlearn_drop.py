"""Snakemake script of the `unlearn_drop` rule: see pipeline_src/steps/unlearn_drop.py."""
from pipeline_src.launch import run_step

run_step("unlearn_drop", snakemake)  # noqa: F821 (injected by Snakemake)
