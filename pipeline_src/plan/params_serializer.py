"""Snakemake's params check without importing pandas while no param can be a pandas object.

To tell whether a job's params changed (the `params` rerun trigger), Snakemake 9 serializes each
param through `PersistenceBase._serialize_param`. Wherever pandas is installed, that imports it,
to hash DataFrame, Series and Index params. This project installs pandas for its reports, so every
dry run of a study with outputs on disk imported it: 0.3 of the 2.3-3.4 CPU-s of the default study's
"Nothing to be done" (docs/performance.md, issue 44).

While pandas is not imported no value can be a pandas object, so Snakemake's builtin serializer
gives the same strings; once anything has imported pandas, Snakemake's own pandas path runs.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

_PATCHED = "_pipeline_pandas_when_imported"


def serialize_param(persistence: Any, value: Any) -> Any:
    """What Snakemake's serializer returns for `value`, importing nothing.

    Args:
        persistence: Snakemake's persistence object (its two serializers).
        value: one param's value.
    """
    if "pandas" in sys.modules:
        return persistence._serialize_param_pandas(value)
    return persistence._serialize_param_builtin(value)


def pandas_only_when_imported() -> bool:
    """Patch `PersistenceBase._serialize_param` to `serialize_param`. Returns whether it patched:
    False where this Snakemake serializes otherwise (another version: left alone) or it is patched already."""
    try:
        from snakemake.persistence import PersistenceBase
    except ImportError:
        return False
    original = PersistenceBase.__dict__.get("_serialize_param")
    have_both = all(hasattr(PersistenceBase, f"_serialize_param_{kind}") for kind in ("pandas", "builtin"))
    if not isinstance(original, property) or not have_both or getattr(original.fget, _PATCHED, False):
        return False

    def chooser(self) -> Callable[[Any], Any]:
        return lambda value: serialize_param(self, value)

    setattr(chooser, _PATCHED, True)
    chooser.__wrapped__ = original.fget
    PersistenceBase._serialize_param = property(chooser)
    return True
