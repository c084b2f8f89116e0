"""A DP study's private workspace is owner-only (docs/privacy.md, "The release boundary").

With `privacy.enabled`, every run (its parse, before any job) sets the umask to 077, so every file
and folder a job writes is created 0600 / 0700, and tightens what exists already: every file and
folder under the results folder and `.snakemake/` loses its group and other bits. So the non-DP
manifests, records and samples table of a study that enabled privacy late are closed at once,
not when a DP job happens to read them. chmod keeps mtimes: nothing reruns. Snakemake's own
job metadata, which it chmods 0660 whatever the umask, is written owner-only too
(`owner_only_metadata`).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from pipeline_src.store.atomic import write_text

OPEN_BITS = 0o077  # group and other


def owner_only_umask() -> int:
    """Set the process umask to 077 (its children, the jobs, inherit it); return the old one."""
    return os.umask(OPEN_BITS)


def privacy_requested(raw_config: dict) -> bool:
    """Whether a config, before validation, enables privacy (`privacy.enabled` true, or a string
    saying so as `--config` may pass it): read at the top of the parse, before it logs a line.

    Args:
        raw_config: Snakemake's config as loaded.
    """
    section = raw_config.get("privacy")
    enabled = section.get("enabled") if isinstance(section, dict) else None
    return enabled is True or str(enabled).lower() in ("true", "yes", "1")


def close_snakemake_log(snakemake_dir: str | os.PathLike = ".snakemake") -> None:
    """Close what Snakemake made before the parse: `.snakemake/` and its log folder (a log file
    still empty there, 0644 under the usual umask): owner-only before the parse writes a line.

    Args:
        snakemake_dir: Snakemake's folder in the working directory.
    """
    folder = Path(snakemake_dir)
    if folder.is_dir():
        os.chmod(folder, stat.S_IMODE(folder.stat().st_mode) & ~OPEN_BITS)
    tighten([folder / "log"])


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


_PATCHED = "_pipeline_owner_only"


def owner_only_metadata() -> bool:
    """Make Snakemake write its job metadata owner-only from its first byte.

    Snakemake's `FilePersistence._io_write` (`.snakemake/metadata/`, `.snakemake/incomplete/`:
    each job's params and inputs, for a shard manifest its members' files) chmods every record it
    creates to 0660 and adds those bits to one that exists, whatever the umask. The patch passes
    the same call an owner-only mode: under the 077 umask the record is created 0600 and stays so,
    also after a kill (`tighten` at the run's end no longer has anything to close there).

    Returns:
        Whether it patched: False where this Snakemake has no such method (another version: left
        alone; `tighten` still closes the records when the run ends) or it is patched already.
    """
    try:
        from snakemake.persistence.file import FilePersistence
    except ImportError:
        return False
    original = getattr(FilePersistence, "_io_write", None)
    if original is None or getattr(original, _PATCHED, False):
        return False

    def io_write(self, subject, json_value, id, mode: int = stat.S_IRUSR | stat.S_IWUSR):
        return original(self, subject, json_value, id, mode=mode & ~OPEN_BITS)

    setattr(io_write, _PATCHED, True)
    io_write.__wrapped__ = original
    FilePersistence._io_write = io_write
    return True


# A real run of a DP study marks its results folder (methods/export.py reads it: store/private_provenance.is_dp_study).
DP_STUDY_MARK = "dp_study.txt"


def mark_dp_study(root: str | os.PathLike) -> None:
    """Mark results folder `root` as a DP study's (a run with `privacy.enabled`, before any job):
    from then on its non-DP models are private workspace, also after privacy is switched off.

    Args:
        root: the study's results folder, `results/<experiment>`.
    """
    path = Path(root) / "provenance" / DP_STUDY_MARK  # store/private_provenance.STORE
    if not path.is_file():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_text("This results folder belongs to a differentially private study (privacy.enabled): everything in "
                   "it but release/ is private workspace, its non-DP models included (docs/privacy.md).\n", path)
