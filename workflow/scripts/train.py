"""Snakemake script of the `train` rule: see pipeline_src/steps/train.py."""
from pipeline_src.runner.launch import run_step

run_step("train", snakemake)  # noqa: F821 (injected by Snakemake)
