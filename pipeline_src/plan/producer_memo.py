"""Snakemake's producer lookup remembered per DAG: one search per distinct file, not one per edge.

To build the DAG, Snakemake 9 asks `OutputIndex.match_producers(file)` which rules can make each
input file of each job, and searches afresh every time: a prefix search over every rule's
outputs, then each candidate rule's output regexes (`Rule.is_producer`). Files that many jobs read
are searched again and again. In the Fashion study's cold dry run (995 jobs), 8,320 lookups name
only 2,698 files, and `prepare/samples.parquet` alone is looked up 505 times (docs/performance.md).

The rules do not change once the Snakefile is parsed, so neither does the answer for a file. This
patch keeps each answer in its OutputIndex (one per DAG) and hands out copies.
"""
from __future__ import annotations

from typing import Any

_PATCHED = "_pipeline_remembered"


def remember_producers() -> bool:
    """Patch `OutputIndex.match_producers` to answer each file once per index. Returns whether it
    patched: False where this Snakemake has no such method (another version: left alone) or it is
    patched already."""
    try:
        from snakemake.output_index import OutputIndex
    except ImportError:
        return False
    original = OutputIndex.__dict__.get("match_producers")
    if original is None or getattr(original, _PATCHED, False):
        return False

    def match_producers(self, targetfile: str) -> set[Any]:
        memo = self.__dict__.setdefault("_pipeline_producers", {})
        key = str(targetfile)  # the lookup reads the path alone, not an IOFile's flags
        found = memo.get(key)
        if found is None:
            found = memo[key] = frozenset(original(self, targetfile))
        return set(found)  # a copy: a caller may change what it gets

    setattr(match_producers, _PATCHED, True)
    match_producers.__wrapped__ = original
    OutputIndex.match_producers = match_producers
    return True
