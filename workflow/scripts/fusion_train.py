"""Snakemake script of the `fusion_train` rule: see pipeline_src/steps/fusion/train.py."""
from pipeline_src.runner.launch import run_step

run_step("fusion.train", snakemake)  # noqa: F821 (injected by Snakemake)
