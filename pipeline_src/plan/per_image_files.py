"""Where per-image records live (`store/per_image.py`), torch-free: the `report` rule, whose claims
table reads them, takes them as inputs. (Like any output whose readers are up to date, a deleted
one is rebuilt after `python -m pipeline_src.store.check_outputs --rebuild`, docs/reliability.md.)
"""
from __future__ import annotations

from pathlib import Path

# The `metrics/<folder>/` of the rules that declare a `per_image` output beside their metrics
# (evaluate_shards and evaluate_soup, the unlearning study's, evaluate_private, fuse, the references).
PER_IMAGE_STEPS = ("evaluate", "unlearn_drop", "unlearn_retrain", "unlearn_paragon", "unlearn_paragon_nonlinear",
                   "private", "fuse", "baselines")


def per_image_path(metrics_path: str | Path) -> Path:
    """The per-image file of a metrics file: its last `metrics` folder swapped for `per_image`, or,
    for a metrics file outside a study's tree (a step run on its own), `<name>.per_image.parquet`
    beside it.

    Args:
        metrics_path: a metrics Parquet file, in a study under `.../metrics/...`.
    """
    parts = list(Path(metrics_path).parts)
    if "metrics" not in parts[:-1]:
        return Path(metrics_path).with_suffix(".per_image.parquet")
    at = len(parts) - 2 - parts[:-1][::-1].index("metrics")
    parts[at] = "per_image"
    return Path(*parts)


def per_image_files(metrics_files: list[str], results: str) -> list[str]:
    """The per-image files beside those of `metrics_files` whose rule writes one.

    Args:
        metrics_files: metrics files of the study (`{results}/metrics/<folder>/...`).
        results: the study's results folder.
    """
    prefixes = tuple(f"{results}/metrics/{step}/" for step in PER_IMAGE_STEPS)
    return [per_image_path(f).as_posix() for f in metrics_files if f.startswith(prefixes)]
