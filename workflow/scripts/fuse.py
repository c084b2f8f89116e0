"""Snakemake script of the `fuse` rule: see pipeline_src/steps/fusion/fuse.py."""
from pipeline_src.runner.launch import run_step

run_step("fusion.fuse", snakemake)  # noqa: F821 (injected by Snakemake)
