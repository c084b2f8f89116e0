"""What the lock's pins require of each other, read from its `# via` comments: the closure of a
set of requirements and the pins only an optional extra needs. The standard library only, and no
import of the other `plan` modules (`environment`, `conda_env` and `lock_extras` all build on it):
the Makefile runs `lock_extras` before anything is installed.
"""
from __future__ import annotations

import re
from pathlib import Path

LOCK_EXTRAS = ("test", "slurm")  # the optional-dependency groups `make lock` resolves with --extra
OPTIONAL_EXTRAS = ("slurm",)  # groups of LOCK_EXTRAS that `make install` leaves out
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a requirement's project name (PEP 508)
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==")
_PARENT = re.compile(r"^#\s+(?:via\s+)?([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(\(.*\))?$")


def normalize(name: str) -> str:
    """PEP 503 normalized project name ('Scikit_Learn' -> 'scikit-learn')."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with path.open("rb") as f:
        return tomllib.load(f)


def lock_parents(lock: str | Path) -> dict[str, set[str]]:
    """{pin: the pins that require it}, from the `# via` comments of a `uv pip compile` lock
    (`via x` on one line, or `via` followed by `#   x` lines). The project itself is not a pin
    and is left out.

    Args:
        lock: the lock file.
    """
    parents: dict[str, set[str]] = {}
    current = None
    in_via = False
    for line in Path(lock).read_text().splitlines():
        m = _ENTRY.match(line)
        if m:
            current, in_via = normalize(m.group(1)), False
            parents[current] = set()
            continue
        s = line.strip()
        if current is None or not s.startswith("#"):
            continue
        if s == "# via":
            in_via = True
            continue
        if s.startswith("# via ") or in_via:
            p = _PARENT.match(s)
            if p and not p.group(3):  # "(pyproject.toml)": a requirement of the project itself
                parents[current].add(normalize(p.group(1)))
    return parents


def requirement_names(requirements: list[str]) -> list[str]:
    """The normalized project names of PEP 508 requirement strings."""
    return [normalize(_NAME.match(r.strip()).group(0)) for r in requirements]


def lock_closure(roots: list[str], lock: str | Path) -> set[str]:
    """`roots` and every pin they require, transitively, by the lock's `# via` comments.

    Args:
        roots: normalized project names.
        lock: the lock file.
    """
    children: dict[str, set[str]] = {}
    for child, parents in lock_parents(lock).items():
        for p in parents:
            children.setdefault(p, set()).add(child)
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(children.get(name, ()))
    return seen


def extra_only_pins(extras: tuple[str, ...], lock: str | Path, pyproject: str | Path) -> set[str]:
    """The pins (normalized names) that only `extras` need: what they require, minus what
    `[project].dependencies` and the other `LOCK_EXTRAS` groups require.

    Args:
        extras: optional-dependency groups of pyproject.toml.
        lock: the lock file.
        pyproject: the project's `pyproject.toml`.
    """
    project = _load_toml(Path(pyproject))["project"]
    groups = project.get("optional-dependencies", {})
    kept = requirement_names(project.get("dependencies", []))
    for extra in LOCK_EXTRAS:
        if extra not in extras:
            kept += requirement_names(groups.get(extra, []))
    left_out = requirement_names([r for extra in extras for r in groups.get(extra, [])])
    return lock_closure(left_out, lock) - lock_closure(kept, lock)
