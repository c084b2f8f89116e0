"""Snakemake script of the `compose_private` rule: see pipeline_src/steps/compose_private.py."""
from pipeline_src.launch import run_step

run_step("compose_private", snakemake)  # noqa: F821 (injected by Snakemake)
