"""Snakemake script of the `compose_private` rule: see pipeline_src/steps/privacy/compose.py."""
from pipeline_src.runner.launch import run_step

run_step("privacy.compose", snakemake)  # noqa: F821 (injected by Snakemake)
