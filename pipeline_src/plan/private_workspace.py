"""A DP study's private workspace is owner-only (docs/privacy.md, "The release boundary").

With `privacy.enabled`, every run (its parse, before any job) sets the umask to 077, so every file
and folder a job writes is created 0600 / 0700, and tightens what exists already: every file and
folder under the results folder and `.snakemake/` loses its group and other bits. So the non-DP
manifests, records and samples table of a study that enabled privacy late are closed at once,
not when a DP job happens to read them. chmod keeps mtimes: nothing reruns.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

OPEN_BITS = 0o077  # group and other


def owner_only_umask() -> int:
    """Set the process umask to 077 (its children, the jobs, inherit it); return the old one."""
    return os.umask(OPEN_BITS)


def tighten(roots: list[str | os.PathLike]) -> int:
    """Remove group and other bits from every file and folder under `roots` (and the roots);
    links are left alone (their targets are tightened where they lie under a root).

    Args:
        roots: folders; missing ones are skipped.
    Returns:
        How many paths were changed.
    """
    changed = 0
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for p in [dirpath, *(os.path.join(dirpath, n) for n in (*dirnames, *filenames))]:
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode) or not st.st_mode & OPEN_BITS:
                    continue
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~OPEN_BITS)
                changed += 1
    return changed
