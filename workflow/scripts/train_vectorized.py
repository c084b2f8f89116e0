"""Snakemake script of the `train_vectorized_*` rules: see pipeline_src/steps/train_vectorized.py."""
from pipeline_src.runner.launch import run_step

run_step("train_vectorized", snakemake)  # noqa: F821 (injected by Snakemake)
