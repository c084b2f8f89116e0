"""Snakemake script of the `train_private` rule: see pipeline_src/steps/privacy/train.py."""
from pipeline_src.runner.launch import run_step

run_step("privacy.train", snakemake)  # noqa: F821 (injected by Snakemake)
