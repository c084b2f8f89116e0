"""Pipeline steps: one module per Snakemake rule, each with `main(args: StepArgs)`."""
