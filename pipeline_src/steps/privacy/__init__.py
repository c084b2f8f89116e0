"""Steps of the privacy study (workflow/rules/privacy.smk)."""
