"""The lock without an optional extra: what `make install` installs (issue 44).

`requirements.lock` is one resolution of `[project].dependencies` and the `LOCK_EXTRAS` groups,
so every pin agrees with every other. An optional extra such as `slurm` (the Slurm executor plugin)
is not installed by default: Snakemake imports every installed `snakemake_executor_plugin_*`
at each start, a dry run included, and the Slurm plugin's imports (pandas) were a tenth of the
default study's dry run; with the Slurm client installed but no controller reachable its start-up
probe also waits about 9 s. `make install` therefore installs the lock minus the pins that only
the extra needs (read from the lock's `# via` comments, `lock_graph.lock_parents`), with their
hashes; `make install-slurm` installs the whole lock. A pin that the default install leaves
out is not an environment drift (`environment.lock_drift`). The standard library suffices: the
Makefile runs this before anything is installed.

    python -m pipeline_src.plan.lock_extras --without slurm requirements.lock --out .venv/requirements-base.txt
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline_src.plan.environment import LOCK_FILE, PYPROJECT
from pipeline_src.plan.lock_graph import _ENTRY, LOCK_EXTRAS, extra_only_pins, normalize


def lock_without(extras: tuple[str, ...], lock: str | Path = LOCK_FILE, pyproject: str | Path = PYPROJECT) -> str:
    """The lock's text minus the entries (pin, hashes, `# via` lines) that only `extras` need.

    Args:
        extras: optional-dependency groups to leave out.
        lock: the lock file.
        pyproject: the project's `pyproject.toml`.
    """
    drop = extra_only_pins(extras, lock, pyproject)
    out, skipping = [], False
    for line in Path(lock).read_text().splitlines():
        m = _ENTRY.match(line)
        if m:
            skipping = normalize(m.group(1)) in drop
        elif line and not line[0].isspace():  # a top-level comment: not part of an entry
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the lock without the pins only an optional extra needs.")
    parser.add_argument("lock", nargs="?", default=str(LOCK_FILE))
    parser.add_argument("--without", action="append", choices=LOCK_EXTRAS, required=True,
                        help="an optional-dependency group to leave out (repeatable)")
    parser.add_argument("--pyproject", default=str(PYPROJECT))
    parser.add_argument("--out", required=True, help="the requirements file to write")
    ns = parser.parse_args(argv)
    text = lock_without(tuple(ns.without), ns.lock, ns.pyproject)
    Path(ns.out).write_text(text)
    left = sorted(extra_only_pins(tuple(ns.without), ns.lock, ns.pyproject))
    print(f"wrote {ns.out}: {ns.lock} without {', '.join(left) or 'nothing'} (extra {', '.join(ns.without)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
