# Named targets that build parts of the study: `snakemake --cores N <target>`.


# The study's backbone alone (`pretrain`: pretrained here, or loaded from timm or a checkpoint),
# with its record: `make fashion-backbones` builds the Fashion backbones once, before the studies.
rule backbone:
    input:
        lambda w: rules.pretrain.output.model,  # a function: data.smk defines `pretrain` after this file


rule evaluate_all:
    input:
        evaluation_targets(),
