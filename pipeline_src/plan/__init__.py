"""Parse time, imports no torch: the validated config and each study's plan (what jobs exist)."""
