"""Snakemake script of the `signature` rule: see pipeline_src/steps/signature.py."""
from pipeline_src.launch import run_step

run_step("signature", snakemake)  # noqa: F821 (injected by Snakemake)
