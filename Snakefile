# Composable, private and removable fine-tuning of vision transformers.
# Rules live in workflow/rules/; the config is validated in common.smk before any job runs.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "workflow/rules/common.smk"


rule all:
    input:
        f"{R}/report",


include: "workflow/rules/targets.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/compose.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/fusion.smk"
include: "workflow/rules/privacy.smk"
include: "workflow/rules/forget.smk"
include: "workflow/rules/last_grid.smk"
