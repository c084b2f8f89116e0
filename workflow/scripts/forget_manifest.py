"""Snakemake script of the `forget_manifest` rule: see pipeline_src/steps/forget/manifest.py."""
from pipeline_src.runner.launch import run_step

run_step("forget.manifest", snakemake)  # noqa: F821 (injected by Snakemake)
