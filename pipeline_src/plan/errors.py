"""The error every parse-time check raises: it names the offending config key as a dotted path."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config that does not satisfy the schema or the study's semantic rules."""
