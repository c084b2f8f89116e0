"""Snakemake script of the `train_private` rule: see pipeline_src/steps/train_private.py."""
from pipeline_src.launch import run_step

run_step("train_private", snakemake)  # noqa: F821 (injected by Snakemake)
