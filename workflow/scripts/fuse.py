"""Snakemake script of the `fuse` rule: see pipeline_src/steps/fuse.py."""
from pipeline_src.launch import run_step

run_step("fuse", snakemake)  # noqa: F821 (injected by Snakemake)
