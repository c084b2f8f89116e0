# Composable, private and removable fine-tuning of vision transformers.
# Rules live in workflow/rules/; the config is validated in common.smk before any job runs.
from snakemake.utils import min_version

min_version("9.0")


# A --configfile is the whole study: the default is loaded only without one, because Snakemake
# would deep-merge the user's file into it and leak the default's keys. --config k=v still overrides.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/inputs.smk"
include: "workflow/rules/study_inputs.smk"


# The first screen of `snakemake --report`: private workspace, whatever the study (docs/privacy.md).
report: "workflow/report/workflow.rst"


rule all:
    input:
        f"{R}/report",
        rebuilds,  # files a killed run deleted, or check_outputs --rebuild listed (plan/run_start.py)
        # a DP study's releasable folder (privacy.smk: release)
        *([f"{R}/release"] if config["privacy"]["enabled"] else []),


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
include: "workflow/rules/ablations.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/baselines.smk"
