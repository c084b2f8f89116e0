"""Snakemake script of the `forget_manifest` rule: see pipeline_src/steps/forget_manifest.py."""
from pipeline_src.launch import run_step

run_step("forget_manifest", snakemake)  # noqa: F821 (injected by Snakemake)
