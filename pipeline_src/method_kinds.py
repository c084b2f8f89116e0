"""What the DAG needs to know about a method kind at parse time, without importing torch."""
from __future__ import annotations


def cached_blocks(method_cfg: dict) -> int | None:
    """How many final blocks the method trains on top of the cacheable frozen prefix:
    0 for `fc` (the prefix is every block), k for `nlft`/`taft`, None for methods that
    train on images (`full`)."""
    kind = method_cfg["kind"]
    if kind == "full":
        return None
    if kind == "fc":
        return 0
    return method_cfg["k"]
