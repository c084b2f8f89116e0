"""What the main Snakemake process does for a run: own it, and clear what killed runs left.

- `own_run` names this process in `PIPELINE_RUN_OWNER` before any job starts; jobs inherit it,
  and one whose Snakemake is gone stops and renames nothing (`runner/orphan_guard.py`,
  `store/atomic.commit`).
- `clear_killed_temps` removes the temporary files of writers killed between write and rename
  (`store/atomic.remove_stale_temps`); `workflow/rules/common.smk` calls it in `onstart`, which
  Snakemake runs holding the run's lock, and never in a dry run; `at_exit` again when the main
  process ends a run that executed, jobs or not, so a leftover is gone even when nothing is to be done.
- `killed_rebuilds` lists the files a killed run had deleted to rebuild them (a `--forcerun`, or
  a rerun on changed params), and those `store/check_outputs.py --rebuild` journaled (`journal_missing`): Snakemake rebuilds a missing file only when a job that needs it runs
  or it is a target, so the Snakefile makes them inputs of the default target `all`. Snakemake
  deletes a job's old outputs before it marks them incomplete, so `journal_rebuilds` lists them
  first, in `onstart`, and `at_exit` drops the entries a run that ended (not killed) rebuilt.
"""
from __future__ import annotations

import atexit
import os
from base64 import urlsafe_b64decode
from pathlib import Path
from typing import Any

from pipeline_src.store.atomic import RUN_OWNER_ENV, remove_stale_temps, run_owner_token, write_text


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


def snakemake_keys(folder: Path) -> set[str]:
    """The file names Snakemake keeps records under `folder` for (base64 names; a long name is
    split into folders whose names start with '@')."""
    keys = set()
    for f in folder.rglob("*") if folder.is_dir() else ():
        if f.is_file():
            parts = f.relative_to(folder).parts
            try:
                keys.add(urlsafe_b64decode("".join(p.removeprefix("@") for p in parts)).decode())
            except (ValueError, UnicodeDecodeError):
                continue  # not a record (e.g. Snakemake's migration marker)
    return keys


REBUILD_JOURNAL = "pipeline_rebuilds.txt"  # in Snakemake's folder: existing outputs a run is about to rebuild


def _journal(snakemake_dir: str | Path) -> set[str]:
    path = Path(snakemake_dir) / REBUILD_JOURNAL
    return set(path.read_text().splitlines()) if path.is_file() else set()


def _still_missing(snakemake_dir: str | Path) -> set[str]:
    return {f for f in _journal(snakemake_dir) if not os.path.lexists(f)}


def _write_journal(snakemake_dir: str | Path, files: set[str]) -> None:
    path = Path(snakemake_dir) / REBUILD_JOURNAL
    if files:
        write_text("".join(f"{f}\n" for f in sorted(files)), path)
    else:
        path.unlink(missing_ok=True)


def journal_rebuilds(results: str | Path, outputs: list[str], snakemake_dir: str | Path = ".snakemake") -> None:
    """Before any job starts: record the `outputs` under `results` that exist now, so the next run
    can tell them from files a user removed if this run is killed after Snakemake deleted them and
    before it marked them incomplete (`jobs.prepare` deletes, `register` marks, a moment later).
    Earlier entries still missing stay.

    Args:
        results: the results folder (`R`); only files under it are kept.
        outputs: the output files of the jobs this run will run.
        snakemake_dir: Snakemake's folder in the working directory.
    """
    prefix = str(results).rstrip("/") + "/"
    existing = {f for f in outputs if f.startswith(prefix) and os.path.lexists(f)}
    _write_journal(snakemake_dir, _still_missing(snakemake_dir) | existing)


def journal_missing(files: list[str], snakemake_dir: str | Path = ".snakemake") -> None:
    """Add outputs that are missing now to the journal, so the next run without targets rebuilds
    them (`store/check_outputs.py --rebuild`: broken outputs it removed, and deleted ones).

    Args:
        files: output paths relative to the working directory.
        snakemake_dir: Snakemake's folder in the working directory.
    """
    Path(snakemake_dir).mkdir(exist_ok=True)
    _write_journal(snakemake_dir, _journal(snakemake_dir) | {f for f in files if not os.path.lexists(f)})


def settle_journal(snakemake_dir: str | Path = ".snakemake") -> None:
    """When a run ends (not killed): keep only the journal's entries still missing."""
    _write_journal(snakemake_dir, _still_missing(snakemake_dir))


def killed_rebuilds(results: str | Path, snakemake_dir: str | Path = ".snakemake") -> list[str]:
    """Files under `results` that a killed run had deleted to rebuild them, sorted.

    Such a file is missing and either is in the journal of files a run was about to rebuild
    (`journal_rebuilds`), or is marked incomplete by Snakemake (its job started and never
    finished) and has a metadata record (a finished job built it before). `--rerun-incomplete`
    skips it, since it looks only at incomplete files that exist, and when the jobs that read it
    are up to date nothing rebuilds it ("Nothing to be done", the file lost).

    Args:
        results: the results folder (`R`); only files under it are listed.
        snakemake_dir: Snakemake's folder in the working directory.
    """
    smk = Path(snakemake_dir)
    prefix = str(results).rstrip("/") + "/"
    journal = {f for f in _journal(smk) if f.startswith(prefix)}
    incomplete = {k for k in snakemake_keys(smk / "incomplete") if k.startswith(prefix)}
    if incomplete:
        journal |= incomplete & snakemake_keys(smk / "metadata")
    return sorted(f for f in journal if not os.path.lexists(f))


def at_exit(workflow: Any, results: str | Path) -> None:
    """When the main process ends a run that executed (not a dry run, `--lint` or `--unlock`,
    whether or not a job started): remove killed writers' temporary files, settle the rebuild
    journal and write the held validation cache (`plan/cache.py`).

    Args:
        workflow: Snakemake's `workflow` object (its executor is known only after the parse).
        results: the results folder.
    """
    from pipeline_src.plan.cache import write_held

    def _done() -> None:
        if getattr(workflow, "executor_plugin", None) is None or workflow.dryrun:
            return
        clear_killed_temps(results)
        settle_journal()
        write_held()

    atexit.register(_done)
