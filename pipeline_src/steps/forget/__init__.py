"""Steps of forgetting and the unlearning study (workflow/rules/forget.smk)."""
