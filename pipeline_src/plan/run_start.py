"""What the main Snakemake process does for a run: own it, and clear what killed runs left.

- `own_run` names this process in `PIPELINE_RUN_OWNER` before any job starts; jobs inherit it,
  and one whose Snakemake is gone stops and renames nothing (`runner/orphan_guard.py`,
  `store/atomic.commit`).
- `clear_killed_temps` removes the temporary files of writers killed between write and rename
  (`store/atomic.remove_stale_temps`); `workflow/rules/common.smk` calls it in `onstart`, which
  Snakemake runs holding the run's lock, and never in a dry run.
"""
from __future__ import annotations

import os
from pathlib import Path

from pipeline_src.store.atomic import RUN_OWNER_ENV, remove_stale_temps, run_owner_token


def own_run() -> None:
    """Name this process as the owner of the run its jobs belong to (they inherit the environment)."""
    os.environ[RUN_OWNER_ENV] = run_owner_token()


def clear_killed_temps(results: str | Path) -> str | None:
    """Remove the temporary files of killed writers under `results`; a line saying so, or None.

    Args:
        results: the results folder.
    """
    stale = remove_stale_temps(results)
    return f"removed {len(stale)} temporary file(s) of killed jobs, e.g. {stale[0]}" if stale else None
