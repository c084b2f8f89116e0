"""Find a study's outputs that no longer read back, or that Snakemake built and are gone, and have
the next run rebuild them (docs/reliability.md, "A broken or missing output").

Snakemake rebuilds a file only when it knows it is missing and a job that runs needs it: a broken
file looks up to date, and a deleted one whose readers are up to date may not be rebuilt ("Nothing
to be done", its rows silently missing). This command checks every Parquet, JSON, safetensors and
.npy file of the study (`store/readable.py`) and every output Snakemake has a record of; with
`--rebuild` it removes the broken outputs and lists them, with the missing ones, in the rebuild
journal (`plan/run_start.py`), whose files the next plain run makes inputs of its target `all`.

    python -m pipeline_src.store.check_outputs --study tiny              # list them; exit 1 if any
    python -m pipeline_src.store.check_outputs --study tiny --rebuild    # then: snakemake --cores 2 ...

Run it in the working directory, as Snakemake.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pipeline_src.plan.run_start import journal_missing, snakemake_keys
from pipeline_src.plan.studies import RESULTS, resolve_study
from pipeline_src.plan.study_lock import running_holder
from pipeline_src.store.readable import CHECKED, unreadable


@dataclass
class OutputCheck:
    """What a check found.

    Args:
        broken: output (a file, or the folder output holding it) -> (the broken file, why).
        unowned: broken files that are no output Snakemake knows (nothing rebuilds them) -> why.
        missing: outputs Snakemake built that are gone.
    """

    broken: dict[str, tuple[str, str]] = field(default_factory=dict)
    unowned: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def _owner(path: str, outputs: set[str]) -> str | None:
    """The output `path` is, or the folder output it is in (e.g. `report/` holds its tables)."""
    for candidate in [path, *(p.as_posix() for p in Path(path).parents)]:
        if candidate in outputs:
            return candidate
    return None


def check_outputs(results: str | Path, snakemake_dir: str | Path = ".snakemake") -> OutputCheck:
    """Check a study's files against what they should be.

    Args:
        results: the study's results folder, relative to the working directory (`results/<experiment>`).
        snakemake_dir: Snakemake's folder in the working directory.
    """
    results = Path(results).as_posix().rstrip("/")
    outputs = {k for k in snakemake_keys(Path(snakemake_dir) / "metadata") if k.startswith(results + "/")}
    found = OutputCheck()
    for dirpath, _, names in os.walk(results):
        for name in sorted(names):
            path = f"{dirpath}/{name}"
            if Path(name).suffix not in CHECKED or name.startswith("."):  # `.<name>.~<pid>tmp`: a writer's
                continue
            why = unreadable(path)
            if why is None:
                continue
            owner = _owner(path, outputs)
            if owner is None:
                found.unowned[path] = why
            else:
                found.broken.setdefault(owner, (path, why))
    found.missing = sorted(k for k in outputs if not os.path.lexists(k))
    return found


def rebuild(found: OutputCheck, snakemake_dir: str | Path = ".snakemake") -> list[str]:
    """Remove the broken outputs and journal them with the missing ones; the files journaled.

    Args:
        found: a check's findings.
        snakemake_dir: Snakemake's folder in the working directory.
    """
    import shutil

    for output in found.broken:
        if os.path.isdir(output) and not os.path.islink(output):
            shutil.rmtree(output)
        else:
            os.unlink(output)
    files = sorted([*found.broken, *found.missing])
    journal_missing(files, snakemake_dir)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline_src.store.check_outputs",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--study", help="the study's name (its experiment): results/<study>")
    which.add_argument("--configfile", help="a study's config: the study named by its experiment")
    which.add_argument("--results", help="a study's results folder, relative to the working directory")
    parser.add_argument("--rebuild", action="store_true",
                        help="remove the broken outputs; the next run rebuilds them and the missing ones")
    ns = parser.parse_args(argv)
    results = ns.results or os.path.relpath(resolve_study(ns.study, ns.configfile, RESULTS))
    found = check_outputs(results)
    for output, (path, why) in found.broken.items():
        print(f"BROKEN {output}" + ("" if path == output else f" (its {path})") + f": {why}")
    for output in found.missing:
        print(f"MISSING {output}: built by an earlier run, gone now")
    for path, why in found.unowned.items():
        print(f"UNREADABLE {path}: {why} (no output of a rule: nothing rebuilds it; remove it by hand)")
    if not (found.broken or found.missing):
        print(f"every output of {results}/ Snakemake built is there and every result file reads back"
              if not found.unowned else f"no output of {results}/ to rebuild")
        return 1 if found.unowned else 0
    if not ns.rebuild:
        print(f"rerun with --rebuild to remove the broken ones; the next run of the study then rebuilds all "
              f"{len(found.broken) + len(found.missing)}")
        return 1
    holder = running_holder(Path(results).name)
    if holder:
        print(f"check_outputs: study '{Path(results).name}' is running ({holder}): nothing removed; run this "
              "when it has ended", file=sys.stderr)
        return 2
    files = rebuild(found)
    print(f"removed {len(found.broken)} broken output(s); the next run of the study rebuilds {len(files)} file(s) "
          "(snakemake --cores N, with the study's --configfile, no targets)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
