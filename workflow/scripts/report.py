"""Snakemake script of the `report` rule: see pipeline_src/steps/report.py."""
from pipeline_src.runner.launch import run_step

run_step("report", snakemake)  # noqa: F821 (injected by Snakemake)
