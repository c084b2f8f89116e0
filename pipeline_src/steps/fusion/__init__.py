"""Steps of the fusion study (workflow/rules/fusion.smk)."""
