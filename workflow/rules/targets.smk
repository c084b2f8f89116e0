# Named targets that build parts of the study: `snakemake --cores N <target>`.


rule evaluate_all:
    input:
        evaluation_targets(),
