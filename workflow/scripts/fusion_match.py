"""Snakemake script of the `fusion_match` rule: see pipeline_src/steps/fusion/match.py."""
from pipeline_src.runner.launch import run_step

run_step("fusion.match", snakemake)  # noqa: F821 (injected by Snakemake)
