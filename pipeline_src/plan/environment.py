"""The environment a result was made in, and the pinned one it should have been made in.

Three things, for docs/environment.md (issue 17):
- `fingerprint()`: a compact record of what moves the numbers (Python, torch with its CUDA and
  cuDNN, timm, opacus, snakemake, numpy, and the git commit with a dirty flag). Every model
  record, metrics row and benchmark row carries it.
- `check_lock()`: the lock file (`requirements.lock`, `make lock`) must pin every requirement of
  `pyproject.toml` (its dependencies and the `test` extra) to a version inside the declared range,
  with hashes. `make test` (so CI) runs it: `python -m pipeline_src.plan.environment --check-lock`.
- `lock_drift()`: installed versions that differ from the lock; `common.smk` warns about them
  once at start-up, since then the numbers may differ from the committed ones.

Importing this module imports no torch (the Snakefile imports it at parse time); `fingerprint()`
imports torch lazily, inside jobs that already hold it. Pinning with hashes follows pip's
"secure installs" practice (`--require-hashes`, PEP 665's motivation).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the checkout this package runs from ('unknown' outside git),
    with '-dirty' when tracked files have uncommitted changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PACKAGE_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PACKAGE_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

LOCK_FILE = PACKAGE_ROOT / "requirements.lock"
PYPROJECT = PACKAGE_ROOT / "pyproject.toml"
LOCK_PYTHON = "3.11"  # the lock's target interpreter (Makefile LOCK_PYTHON)
FINGERPRINT_PACKAGES = ("timm", "opacus", "snakemake", "numpy")  # besides python and torch

from pipeline_src.plan.lock_graph import LOCK_EXTRAS, OPTIONAL_EXTRAS, _load_toml, extra_only_pins, normalize  # noqa: E402,F401

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cudnn_version(torch) -> str | None:
    """cuDNN's version as 'major.minor.patch' (cuDNN 9 encodes it as major*10000 + minor*100 + patch,
    earlier releases as major*1000 + ...), or None where torch has no cuDNN."""
    if not torch.backends.cudnn.is_available():
        return None
    v = torch.backends.cudnn.version()
    if v is None:
        return None
    major, rest = divmod(v, 10000) if v >= 90000 else divmod(v, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


@functools.lru_cache(maxsize=1)
def fingerprint() -> dict:
    """The versions a result depends on, and the code's commit.

    Returns: {'python', 'torch', 'cuda', 'cudnn', 'timm', 'opacus', 'snakemake', 'numpy',
    'commit', 'dirty'}: version strings (None for an absent package; `cuda` and `cudnn` are the
    versions torch was built with, None on a CPU-only build), `commit` the git SHA ('unknown'
    outside git) and `dirty` whether tracked files had uncommitted changes.
    """
    import torch  # lazily: see the module docstring

    commit = git_commit()
    fp = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
          "cudnn": _cudnn_version(torch)}
    fp.update({name: _installed_version(name) for name in FINGERPRINT_PACKAGES})
    fp.update(commit=commit.removesuffix("-dirty"), dirty=commit.endswith("-dirty"))
    return fp


def fingerprint_json() -> str:
    """`fingerprint()` as canonical JSON (sorted keys, no spaces): the `environment` column of
    metrics and benchmark rows. Equal environments give equal strings, so SQL can group by it
    and read fields with `environment->>'torch'`."""
    return json.dumps(fingerprint(), sort_keys=True, separators=(",", ":"))


def read_lock(path: str | Path) -> dict[str, str]:
    """The pins of a pip requirements lock: {normalized name: version}.

    Args:
        path: a `uv pip compile --generate-hashes` (or pip-compile) output file.

    Raises:
        ValueError: naming the file and line of an entry that is not `name==version` or has no hash.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"lock file {path} does not exist: run `make lock`")
    pins: dict[str, str] = {}
    entries: list[tuple[int, str, bool]] = []  # (line number, requirement, has a hash)
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[0].isspace():  # a continuation: hashes or a comment of the entry above
            if entries and "--hash=" in stripped:
                entries[-1] = (*entries[-1][:2], True)
            continue
        if stripped.startswith("-"):  # options such as --index-url: allowed, nothing to pin
            continue
        entries.append((lineno, stripped.rstrip("\\").strip(), "--hash=" in stripped))
    for lineno, req, hashed in entries:
        m = _PIN.match(req)
        if not m:
            raise ValueError(f"{path}:{lineno}: '{req}' is not pinned as name==version")
        if not hashed:
            raise ValueError(f"{path}:{lineno}: '{req}' has no --hash (pip install --require-hashes needs one)")
        name = normalize(m.group(1))
        if name in pins:
            raise ValueError(f"{path}:{lineno}: '{m.group(1)}' is pinned twice")
        pins[name] = m.group(3)
    if not pins:
        raise ValueError(f"lock file {path} pins nothing")
    return pins


def check_lock(lock: str | Path = LOCK_FILE, pyproject: str | Path = PYPROJECT) -> list[str]:
    """Where `pyproject.toml` and the lock disagree; an empty list when they agree.

    Every requirement of `[project].dependencies` and of the `LOCK_EXTRAS` optional groups must
    be pinned in the lock, to a version its specifier admits. (The lock may pin more: the
    transitive dependencies.)

    Args:
        lock: the lock file.
        pyproject: the project's `pyproject.toml`.

    Raises:
        ValueError: when the lock itself is malformed (see `read_lock`).
    """
    from packaging.requirements import Requirement
    from packaging.version import Version

    pins = read_lock(lock)
    project = _load_toml(Path(pyproject))["project"]
    groups = {"dependencies": project.get("dependencies", [])}
    extras = project.get("optional-dependencies", {})
    for extra in LOCK_EXTRAS:
        if extra not in extras:
            return [f"{pyproject}: optional-dependencies has no '{extra}' group, but the lock resolves it"]
        groups[f"optional-dependencies.{extra}"] = extras[extra]
    problems = []
    for group, reqs in groups.items():
        for text in reqs:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": group.rpartition(".")[2]}):
                continue  # not for this platform / interpreter
            name = normalize(req.name)
            if name not in pins:
                problems.append(f"{pyproject} {group} requires '{text}', but {lock} has no pin for {req.name}: run `make lock`")
            elif not req.specifier.contains(Version(pins[name]), prereleases=True):
                problems.append(f"{pyproject} {group} requires '{text}', but {lock} pins {req.name}=={pins[name]}: run `make lock`")
    return problems


def _installed_versions() -> dict[str, str]:
    """{normalized name: version} of every installed distribution, first on sys.path first (as
    for import). Reads the `{name}-{version}.dist-info` folder names (the "Recording installed
    projects" spec fixes that format), which is ~10x faster than parsing every METADATA file;
    other layouts (.egg-info) fall back to importlib.metadata."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for folder in names:
            stem = folder[: -len(".dist-info")]
            if folder.endswith(".dist-info") and stem.count("-") == 1:
                name, version = stem.split("-")
                found.setdefault(normalize(name), version)
            elif folder.endswith((".egg-info", ".dist-info")):
                dist = metadata.PathDistribution(Path(entry or ".") / folder)
                if dist.metadata["Name"]:
                    found.setdefault(normalize(dist.metadata["Name"]), dist.version)
    return found


def _same_version(installed: str | None, locked: str) -> bool:
    """Equal as PEP 440 versions ('1.0' == '1.0.0'; a local label such as '+cpu' differs)."""
    from packaging.version import InvalidVersion, Version  # snakemake has loaded it already

    if installed is None:
        return False
    try:
        return Version(installed) == Version(locked)
    except InvalidVersion:
        return installed == locked


def lock_drift(lock: str | Path = LOCK_FILE, pyproject: str | Path = PYPROJECT) -> list[tuple[str, str, str | None]]:
    """Locked packages whose installed version differs: [(name, locked, installed or None)].

    Cheap enough for the Snakefile's parse: reads package metadata, imports nothing. A pin only an
    optional extra needs (`lock_graph.OPTIONAL_EXTRAS`, e.g. the Slurm plugin) counts when installed.
    Also reports the interpreter as ('python', LOCK_PYTHON, running major.minor) when they differ.
    """
    installed = _installed_versions()
    # a workflow copied without its project file: no pin is known to be an extra's
    optional = extra_only_pins(OPTIONAL_EXTRAS, lock, pyproject) if Path(pyproject).is_file() else set()
    drift = [(name, want, installed.get(name)) for name, want in read_lock(lock).items()
             if not _same_version(installed.get(name), want)
             and not (name in optional and name not in installed)]  # an extra `make install` leaves out
    running = ".".join(platform.python_version_tuple()[:2])
    if running != LOCK_PYTHON:
        drift.insert(0, ("python", LOCK_PYTHON, running))
    return drift


def lock_drift_message(lock: str | Path = LOCK_FILE, show: int = 8) -> str | None:
    """A one-paragraph warning naming the differing versions, or None when all match the lock.

    Args:
        lock: the lock file.
        show: how many differing packages to name (the rest are counted).
    """
    try:
        drift = lock_drift(lock)
    except ValueError as err:
        return f"cannot compare the running versions with the lock: {err}"
    if not drift:
        return None
    key = set(FINGERPRINT_PACKAGES) | {"python", "torch"}
    drift.sort(key=lambda d: (d[0] not in key, d[0]))  # the packages that move the numbers first
    named = ", ".join(f"{n} {have or 'not installed'} (lock: {want})" for n, want, have in drift[:show])
    more = f" and {len(drift) - show} more" if len(drift) > show else ""
    return (f"{len(drift)} package version(s) differ from {Path(lock).name}: {named}{more}. Results may "
            "differ from the committed ones; `make install` (in a fresh .venv) installs the locked versions.")


def warn_on_lock_drift(logger, lock: str | Path = LOCK_FILE) -> str | None:
    """Log `lock_drift_message` as a warning, once per process (the first call), and return it.

    Args:
        logger: a `logging.Logger`, e.g. `snakemake.logging.logger`.
        lock: the lock file.
    """
    global _warned
    if _warned:
        return None
    _warned = True
    message = lock_drift_message(lock)
    if message:
        logger.warning(f"Environment: {message}")
    return message


_warned = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the pinned environment (requirements.lock).")
    parser.add_argument("--check-lock", metavar="LOCK", nargs="?", const=str(LOCK_FILE),
                        help="fail when pyproject.toml and the lock disagree (default lock: %(const)s)")
    parser.add_argument("--pyproject", default=str(PYPROJECT))
    parser.add_argument("--drift", action="store_true", help="list installed versions that differ from the lock")
    parser.add_argument("--fingerprint", action="store_true", help="print this environment's fingerprint (imports torch)")
    ns = parser.parse_args(argv)
    if not (ns.check_lock or ns.drift or ns.fingerprint):
        parser.error("give --check-lock, --drift or --fingerprint")
    status = 0
    if ns.check_lock:
        try:
            problems = check_lock(ns.check_lock, ns.pyproject)
        except ValueError as err:
            problems = [str(err)]
        for p in problems:
            print(f"lock mismatch: {p}", file=sys.stderr)
        if problems:
            status = 1
        else:
            print(f"{ns.check_lock} agrees with {ns.pyproject} ({len(read_lock(ns.check_lock))} pins)")
    if ns.drift:
        print(lock_drift_message(ns.check_lock or LOCK_FILE) or "installed versions match the lock")
    if ns.fingerprint:
        print(json.dumps(fingerprint(), indent=1, sort_keys=True))
    return status


if __name__ == "__main__":
    sys.exit(main())
