"""Snakemake script of the `fusion_match` rule: see pipeline_src/steps/fusion_match.py."""
from pipeline_src.launch import run_step

run_step("fusion_match", snakemake)  # noqa: F821 (injected by Snakemake)
