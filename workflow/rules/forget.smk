# The forget study. Append its metrics files to STUDY_METRICS (common.smk) so `report` (and `all`) build them.
