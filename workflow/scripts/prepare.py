"""Snakemake script of the `prepare` rule: see pipeline_src/steps/prepare.py."""
from pipeline_src.runner.launch import run_step

run_step("prepare", snakemake)  # noqa: F821 (injected by Snakemake)
