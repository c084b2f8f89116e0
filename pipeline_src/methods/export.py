"""Export one trained, composed or DP model as a self-contained folder a user can share and load:

    python -m pipeline_src.methods.export <model.safetensors> <dest> [--backbone DIR] [--export-non-private-model]

    <dest>/model.safetensors       the tuned tensors (as trained or composed)
    <dest>/model.json              what rebuilds the model: method settings, classes, head seed,
                                   backbone digest; for DP models the privacy record (ε, δ, σ, C,
                                   q, steps, accountant, neighbouring relation)
    <dest>/backbone/               the frozen backbone: model.safetensors + backbone.json

Loading (`load_exported(dest)`) needs nothing from `results/`. A DP model's export keeps a
whitelist of record keys, so nothing that identifies members is copied (no sample ids, no
membership ref, no component paths); afterwards every exported file is scanned for each member
id found in the private provenance store, and the export is removed and refused on a hit.

In a DP study (`private_provenance.is_dp_study`) a non-DP model is refused: it was trained without
differential privacy on the study's private data and its record lists its members. Only the flag
`--export-non-private-model` (`export_non_private_model=True`) exports it, as private workspace:
its folder then holds PRIVATE_WORKSPACE.txt. Every export of a DP study, DP or not, is owner-only
(folders 0700, files 0600), whatever the umask.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Sequence

from pipeline_src.methods.byte_search import find_any
from pipeline_src.plan.studies import add_study_args, in_study
from pipeline_src.store.atomic import write_json

NON_PRIVATE_FLAG = "--export-non-private-model"
PRIVATE_NOTICE = ("PRIVATE WORKSPACE: a model trained WITHOUT differential privacy on a DP study's private data, "
                  f"exported with {NON_PRIVATE_FLAG}. No DP guarantee covers it; model.json lists its training "
                  "samples. Do not hand it out (docs/privacy.md).\n")
UNKEYED_DIGEST = "ids_sha256"  # pretrain_data of backbones from before issue 43
DP_RECORD_KEYS = ("kind", "composition", "method", "method_config", "regime", "trained_parameters", "dp_settings",
                  "privacy", "experiment", "shards", "num_classes", "head_seed", "backbone_digest",
                  "linearization_id", "weights", "commit", "created_at", "environment")


def is_private(record: dict) -> bool:
    return "privacy" in record or record.get("kind") in ("private", "composed-private")


def member_ids(model_path: str | Path) -> set[str]:
    """Every sample id any component of the model trained on (DP ones from the private store)."""
    from pipeline_src.store.audit import audit_model, members_of, read_record

    result = audit_model(model_path, [])
    ids: set[str] = set()
    for p in result.checked:
        own = members_of(Path(p), read_record(Path(p)))
        ids |= own or set()
    return ids


def _strings(value) -> list[str]:
    """Every string in a parsed JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _parsed_strings(path: Path, data: bytes) -> list[str]:
    """The strings a reader of `path` sees after parsing: a JSON file's values and keys, a
    safetensors header's (its metadata); JSON escapes such as `\u00e9` are decoded."""
    try:
        if path.suffix == ".json":
            return _strings(json.loads(data))
        if path.suffix == ".safetensors" and len(data) >= 8:
            size = int.from_bytes(data[:8], "little")
            return _strings(json.loads(data[8:8 + size]))
    except (ValueError, UnicodeDecodeError):
        pass
    return []


def leaked_member(path: Path, members: set[str]) -> str | None:
    """A member id found in `path`: in its raw bytes (UTF-8, or JSON-escaped) or in any string of
    its parsed JSON or safetensors header; None when there is none."""
    data = path.read_bytes()
    texts = _parsed_strings(path, data)
    forms = {}  # each id's bytes as written raw (UTF-8) and by json.dumps (ensure_ascii), -> the id
    for i in filter(None, members):
        forms.setdefault(i.encode(), i)
        forms.setdefault(json.dumps(i)[1:-1].encode(), i)
    found = find_any(data, forms) if forms else None  # one pass over the bytes for all ids (`byte_search`)
    if found is not None:
        return forms[found]
    # the parsed strings, NUL-separated: an id without a NUL found there lies inside one of them
    joined = "\0".join(texts).encode("utf-8", "surrogatepass")
    found = find_any(joined, {i.encode("utf-8", "surrogatepass"): i for i in members if i and "\0" not in i})
    if found is not None:
        return found.decode("utf-8", "surrogatepass")
    return next((i for i in members if "\0" in i and any(i in t for t in texts)), None)


def in_dp_study(model_path: Path, record: dict) -> bool:
    """Whether the model belongs to a DP study: a DP model, or any model of a marked results folder."""
    from pipeline_src.store.private_provenance import is_dp_study, results_root_of

    if is_private(record):
        return True
    try:
        return is_dp_study(results_root_of(model_path))
    except FileNotFoundError:  # a model outside any results folder: no study to speak for
        return False


def copy_backbone(backbone_dir: Path, dest: Path, dp_study: bool) -> None:
    """Copy the backbone's weights and record into folder `dest` (created). In a DP study the record
    leaves out `pretrain_data.ids_sha256`, an unkeyed digest of the pool's ids that backbones
    pretrained before issue 43 still carry (a reader who guesses the pool could confirm it).

    Args:
        backbone_dir: the backbone folder (`<results>/pretrain`).
        dest: the export's (or release's) `backbone/`.
        dp_study: whether the model belongs to a DP study.
    """
    dest.mkdir(exist_ok=True)
    shutil.copyfile(backbone_dir / "model.safetensors", dest / "model.safetensors")
    record = json.loads((backbone_dir / "backbone.json").read_text())
    data = record.get("pretrain_data")
    if dp_study and isinstance(data, dict) and UNKEYED_DIGEST in data:
        write_json({**record, "pretrain_data": {k: v for k, v in data.items() if k != UNKEYED_DIGEST}},
                   dest / "backbone.json")
    else:
        shutil.copyfile(backbone_dir / "backbone.json", dest / "backbone.json")


def _close(folder: Path) -> None:
    """Owner-only: folders 0700, files 0600 (links left alone)."""
    for p in [folder, *folder.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o700 if p.is_dir() else 0o600)


def export_model(model_path: str | Path, dest: str | Path, backbone_dir: str | Path | None = None,
                 export_non_private_model: bool = False) -> Path:
    """Write the export folder; return it.

    Args:
        model_path: a `.safetensors` model with its `.json` record beside it.
        dest: a new (or empty) folder.
        backbone_dir: the backbone folder (default: `<results>/pretrain` of the model's results folder).
        export_non_private_model: export a non-DP model of a DP study anyway (private workspace).
    Raises:
        FileExistsError: dest holds files. ValueError: the backbone does not match the model's
            digest, or a DP export would contain a member id. PermissionError: a non-DP model of a DP
            study without `export_non_private_model`.
    """
    from safetensors.torch import load_file

    from pipeline_src.store.private_provenance import results_root_of
    from pipeline_src.vit.digest import state_digest

    model_path, dest = Path(model_path), Path(dest)
    if not model_path.is_file() or not model_path.with_suffix(".json").is_file():
        raise FileNotFoundError(f"export: no model {model_path} with its record {model_path.with_suffix('.json').name}")
    record = json.loads(model_path.with_suffix(".json").read_text())
    private, dp_study = is_private(record), in_dp_study(model_path, record)
    if dp_study and not private and not export_non_private_model:
        raise PermissionError(
            f"export: refusing {model_path}: a model trained without differential privacy in a DP study. It is "
            "private workspace (docs/privacy.md): no DP guarantee covers it, and its record names the samples it "
            "trained on (or its components'). To export it anyway, as private workspace "
            f"(owner-only, marked PRIVATE_WORKSPACE.txt), pass {NON_PRIVATE_FLAG}.")
    backbone_dir = Path(backbone_dir) if backbone_dir else results_root_of(model_path) / "pretrain"
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"export: {dest} is not empty")
    want = record.get("backbone_digest")
    if want and state_digest(load_file(backbone_dir / "model.safetensors")) != want:
        raise ValueError(f"export: backbone {backbone_dir} is not the one {model_path} was trained on")
    out = {k: record[k] for k in DP_RECORD_KEYS if k in record} if private else dict(record)
    staging = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir(mode=0o700 if dp_study else 0o777)  # a DP study's: closed before its first byte
    shutil.copyfile(model_path, staging / "model.safetensors")
    write_json({**out, "exported_from": None if private else str(model_path)}, staging / "model.json")
    copy_backbone(backbone_dir, staging / "backbone", dp_study)
    if dp_study and not private:
        (staging / "PRIVATE_WORKSPACE.txt").write_text(PRIVATE_NOTICE)
    if private:
        members = member_ids(model_path)
        for f in staging.rglob("*"):
            if f.is_file():
                leaked = leaked_member(f, members)
                if leaked is not None:
                    shutil.rmtree(staging)
                    raise ValueError(f"export: refusing: {f.name} would contain member id '{leaked}'")
    if dp_study:
        _close(staging)
    if dest.exists():
        dest.rmdir()
    staging.rename(dest)
    return dest


def load_exported(dest: str | Path):
    """Rebuild an exported model: (model in eval mode, its record, the backbone record)."""
    from pipeline_src.methods.loading import load_tuned_model

    dest = Path(dest)
    model, record, backbone_record = load_tuned_model(dest / "backbone", dest / "model.safetensors")
    return model.eval(), record, backbone_record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline_src.methods.export", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .safetensors model with its .json record beside it")
    parser.add_argument("dest", help="the export folder to create")
    parser.add_argument("--backbone", help="backbone folder (default: <results>/pretrain)")
    parser.add_argument(NON_PRIVATE_FLAG, action="store_true",
                        help="export a model trained WITHOUT differential privacy from a DP study (refused otherwise): "
                             "private workspace, with its member ids; owner-only and marked PRIVATE_WORKSPACE.txt")
    add_study_args(parser)  # --study / --configfile: `model` is then a path inside that study's folder
    a = parser.parse_args(argv)
    a.model = in_study(a.model, a)
    try:
        dest = export_model(a.model, a.dest, a.backbone, export_non_private_model=a.export_non_private_model)
    except PermissionError as e:
        print(e, file=sys.stderr)
        return 2
    if (dest / "PRIVATE_WORKSPACE.txt").is_file():
        print(f"WARNING: {PRIVATE_NOTICE.strip()}", file=sys.stderr)
    record = json.loads((dest / "model.json").read_text())
    what = "DP model (no member ids)" if is_private(record) else "model"
    print(f"exported {what} {a.model} → {dest}; load with pipeline_src.methods.export.load_exported('{dest}')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
