"""What the DAG needs to know about a method kind at parse time, without importing torch."""
from __future__ import annotations


def feature_cache(method_cfg: dict) -> str | None:
    """Name of the frozen-feature cache the method trains from, or None (trains on images).

    `last{k}`: tokens entering the last k blocks (fc: k = 0; nlft/taft: their k);
    `blocks`: the embedding and every block's output (LAST side networks).
    """
    kind = method_cfg["kind"]
    if kind == "full":
        return None
    if kind == "last":
        return "blocks"
    return f"last{0 if kind == 'fc' else method_cfg['k']}"
