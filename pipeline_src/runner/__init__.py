"""How a Snakemake job runs a step: launch, fork server, step args, GPU slots, runtime."""
