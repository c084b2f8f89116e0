"""Snakemake script of the `fusion_train` rule: see pipeline_src/steps/fusion_train.py."""
from pipeline_src.launch import run_step

run_step("fusion_train", snakemake)  # noqa: F821 (injected by Snakemake)
