"""Snakemake script of the `split` rule: see pipeline_src/steps/split.py."""
from pipeline_src.runner.launch import run_step

run_step("split", snakemake)  # noqa: F821 (injected by Snakemake)
