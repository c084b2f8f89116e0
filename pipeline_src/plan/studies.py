"""Studies side by side: each study's outputs under `results/<experiment>/` (docs/studies.md).

A study is named by its config's `experiment` key, a folder name (`name_error` says why not). The
workflow's `R` is `study_results(experiment)`; the commands that read a study (query, forget,
audit, export) take it by name (`--study`) or from its config (`--configfile`).

Until this layout, every study wrote `results/<step>/...`. Such a folder is refused with a message
(`old_layout_error`), never rerun silently, and `python -m pipeline_src.plan.studies move-old-layout`
moves it into `results/<experiment>/`, rewriting Snakemake's metadata of the moved files so that
nothing reruns.

    python -m pipeline_src.plan.studies list                      # the studies under results/
    python -m pipeline_src.plan.studies where --configfile studies/fashion_mnist.yaml   # results/fashion-mnist
    python -m pipeline_src.plan.studies move-old-layout --configfile config.yaml
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from base64 import urlsafe_b64decode, urlsafe_b64encode
from pathlib import Path

import yaml

RESULTS = "results"
# The schema's pattern and maxLength of `experiment`: a folder name that is no option ('-rf') nor
# hidden ('.', '..'), short enough for the file names built on it (255 bytes per name).
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MAX_NAME = 100
# Shared by every study, never a study's name: the machine's benchmark rows (benchmarks/*.py).
SHARED = ("benchmarks",)
# Files only the old layout has directly under results/ (a study's own are one level deeper).
OLD_MARKERS = ("prepare/samples.parquet", "pretrain/model.safetensors", "report/index.md", "signatures/upstream.json")


def name_error(experiment: object) -> str | None:
    """Why `experiment` is no study name (None: it is one); the message never echoes a long name whole.

    Args:
        experiment: the config's `experiment` value (anything).
    """
    if not isinstance(experiment, str):
        return f"the study's name must be a string, got {type(experiment).__name__}"
    shown = repr(experiment) if len(experiment) <= 40 else f"{experiment[:40]!r}..."
    if len(experiment) > MAX_NAME:
        return f"{shown} has {len(experiment)} characters; a study's name has at most {MAX_NAME} (it is a folder name)"
    if not NAME.match(experiment):
        return (f"{shown} is not a folder name a study can have: letters, digits, '_', '.' and '-' only, "
                "the first a letter, digit or '_' (no option like '-rf', no hidden folder)")
    if experiment in SHARED:
        return f"{shown} is taken: results/{experiment}/ holds the rows every study shares"
    return None


def study_results(experiment: object, root: str = RESULTS) -> str | None:
    """A study's results folder, `<root>/<experiment>`; None for a name the schema refuses.

    Args:
        experiment: the config's `experiment` value (anything: a missing or bad one gives None).
        root: the folder of all studies.
    """
    return None if name_error(experiment) else f"{root}/{experiment}"


def slurm_jobname_prefix(experiment: str) -> str:
    """The Slurm job-name prefix of a study's jobs (the plugin allows letters, digits, '_' and
    '-', at most 50 characters): two studies on one cluster are told apart by `squeue`."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", experiment)[:50]


def old_layout(root: str | Path = RESULTS) -> list[str]:
    """The old-layout files found directly under `root` (empty: none)."""
    return [f"{root}/{m}" for m in OLD_MARKERS if (Path(root) / m).is_file()]


def old_layout_error(root: str | Path, experiment: object) -> str | None:
    """The message that refuses a run over an old-layout `root` (None: the layout is current)."""
    found = old_layout(root)
    if not found:
        return None
    name = experiment if isinstance(experiment, str) and study_results(experiment) else "<experiment>"
    return (f"{root}/ holds a study in the old layout ({found[0]}): studies now live in {root}/<experiment>/. "
            f"Nothing was run. Move it into the study it belongs to (its config's `experiment`, here "
            f"'{name}'), with Snakemake's metadata, so that nothing reruns:\n"
            f"    python -m pipeline_src.plan.studies move-old-layout --study {name}\n"
            f"or delete it (make clean-results).")


def experiment_of(configfile: str | Path) -> str:
    """The `experiment` of a config file; a clear error when it has none."""
    try:
        cfg = yaml.safe_load(Path(configfile).read_text()) or {}
    except OSError as e:
        raise SystemExit(f"cannot read config {configfile}: {e.strerror}") from None
    name = cfg.get("experiment") if isinstance(cfg, dict) else None
    if study_results(name) is None:
        raise SystemExit(f"config {configfile}: key 'experiment' (the study's name): "
                         f"{name_error(name) if name is not None else 'missing'}")
    return name


def resolve_study(study: str | None = None, configfile: str | Path | None = None, root: str = RESULTS) -> Path:
    """A study's results folder from its name or its config file (default: config.yaml's study).

    Args:
        study: the study's name (its `experiment`).
        configfile: a study's config; used when `study` is None.
        root: the folder of all studies.
    Raises:
        SystemExit: no such study, naming those there are.
    """
    name = study or experiment_of(configfile or "config.yaml")
    path = study_results(name, root)
    if path is None:
        raise SystemExit(f"no study: {name_error(name)}")
    if not Path(path).is_dir():
        if old_layout(root):
            raise SystemExit(old_layout_error(root, name))
        raise SystemExit(f"no study '{name}' under {root}/ (there: {', '.join(list_studies(root)) or 'none'})")
    return Path(path)


def add_study_args(parser: argparse.ArgumentParser) -> None:
    """The `--study` / `--configfile` options of a command that reads one study's files."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--study", help="the study's name (its experiment): paths are under results/<study>/")
    which.add_argument("--configfile", help="a study's config: paths are under results/<its experiment>/")


def in_study(path: str, ns: argparse.Namespace) -> str:
    """`path` inside the study that `--study` or `--configfile` names (e.g. `compose/x/soup.safetensors`
    → `results/<study>/compose/x/soup.safetensors`); as given without either option."""
    if not (ns.study or ns.configfile):
        return path
    return str(resolve_study(ns.study, ns.configfile) / path)


def list_studies(root: str | Path = RESULTS) -> list[str]:
    """The names of the studies under `root`: its folders that a run wrote into (`prepare/`, `logs/`
    or `metrics/`), less the shared ones and the steps of an old layout."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = {m.split("/")[0] for m in OLD_MARKERS} | {"metrics", "logs", "train", "compose", "split", "features"}
    legacy = bool(old_layout(root))
    return sorted(p.name for p in root.iterdir() if p.is_dir() and study_results(p.name)
                  and not (legacy and p.name in steps) and any((p / d).is_dir() for d in ("prepare", "logs", "metrics")))


def _rewrite(value, old: str, new: str):
    """`value` with every string that is a path under `old/` moved under `new/` (recursively)."""
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, list):
        return [_rewrite(v, old, new) for v in value]
    if isinstance(value, dict):
        return {_rewrite(k, old, new): _rewrite(v, old, new) for k, v in value.items()}
    return value


def _decode_record_name(rel: Path) -> str | None:
    """The output path a Snakemake metadata file is named after (`persistence/file.py`:
    urlsafe base64, split into '@'-prefixed folders when longer than a file name)."""
    try:
        return urlsafe_b64decode("".join(p.lstrip("@") for p in rel.parts)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _record_rel(target: str, max_len: int) -> Path:
    b64 = urlsafe_b64encode(target.encode()).decode()
    parts = [b64[i:i + max_len - 1] for i in range(0, len(b64), max_len - 1)]
    return Path(*(["@" + p for p in parts[:-1]] + [parts[-1]]))


def move_metadata(workdir: Path, old: str, new: str) -> int:
    """Rename Snakemake's metadata records of outputs under `old/` to `new/`, with the paths they
    hold (inputs, logs, params, checksums) moved too; the number of records moved."""
    meta = workdir / ".snakemake" / "metadata"
    if not meta.is_dir():
        return 0
    max_len = os.pathconf(meta, "PC_NAME_MAX") or 255
    moved = 0
    for f in sorted(p for p in meta.rglob("*") if p.is_file()):
        target = _decode_record_name(f.relative_to(meta))
        if target is None or not target.startswith(old + "/"):
            continue
        record = _rewrite(json.loads(f.read_text()), old, new)
        dest = meta / _record_rel(new + target[len(old):], max_len)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, dest)
        f.unlink()
        moved += 1
    return moved


def move_old_layout(experiment: str, workdir: str | Path = ".", root: str = RESULTS) -> str:
    """Move an old-layout `results/` into `results/<experiment>/` (files keep their times) and
    Snakemake's metadata with them; a line saying what moved.

    Args:
        experiment: the study the old results belong to.
        workdir: the workflow's working directory.
        root: the results folder, relative to `workdir`.
    """
    workdir = Path(workdir)
    dest_rel = study_results(experiment, root)
    if dest_rel is None:
        raise SystemExit(f"no study: {name_error(experiment)}")
    if not old_layout(workdir / root):
        raise SystemExit(f"{workdir / root}/ is not in the old layout: nothing to move")
    dest = workdir / dest_rel
    if dest.exists():
        raise SystemExit(f"{dest} exists already: move or delete it first")
    keep = set(SHARED) | set(list_studies(workdir / root))  # studies of the new layout stay where they are
    entries = [p for p in (workdir / root).iterdir() if p.name not in keep and not p.name.startswith(".git")]
    dest.mkdir(parents=True)
    for p in entries:
        os.rename(p, dest / p.name)  # same file system: times and contents unchanged
    records = move_metadata(workdir, root, dest_rel)
    return f"moved {len(entries)} entries of {root}/ into {dest_rel}/ and {records} Snakemake metadata records"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the studies under results/")
    where = sub.add_parser("where", help="a study's results folder, from its config (default: config.yaml)")
    where.add_argument("--configfile", default="config.yaml")
    move = sub.add_parser("move-old-layout", help="move results/<step>/ into results/<experiment>/<step>/")
    move.add_argument("--study", help="the study's name (its config's experiment)")
    move.add_argument("--configfile", help="the study's config (default: config.yaml of --directory)")
    move.add_argument("--directory", default=".", help="the workflow's working directory")
    ns = parser.parse_args(argv)
    if ns.cmd == "list":
        print("\n".join(list_studies()))
        return 0
    if ns.cmd == "where":
        print(study_results(experiment_of(ns.configfile)))
        return 0
    # The default study is the one whose config.yaml is in the working directory, as for Snakemake.
    print(move_old_layout(ns.study or experiment_of(ns.configfile or Path(ns.directory) / "config.yaml"), ns.directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
