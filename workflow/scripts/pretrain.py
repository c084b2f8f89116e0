"""Snakemake script of the `pretrain` rule: see pipeline_src/steps/pretrain.py."""
from pipeline_src.runner.launch import run_step

run_step("pretrain", snakemake)  # noqa: F821 (injected by Snakemake)
