"""The private provenance store: which samples trained each DP model, kept in the results folder
and never in a model's own files (record, weights, export, metrics).

    <results>/provenance/key                    32 random bytes (mode 0600), made once per results folder
                                                (`plan/provenance_key.py`; it also keys a DP study's
                                                rerun triggers built from id lists)
    <results>/provenance/members/<ref>.parquet  one DP model's member ids (column sample_id; mode 0600)
    <results>/provenance/dp_study.txt           the mark of a DP study (written by every run with
                                                privacy.enabled): its non-DP models are private workspace

A DP model's record names its members only by `membership_ref` = HMAC-SHA256(key, sorted ids).
A plain digest of the ids would be a membership oracle (hash a guessed member list, compare);
without the key the ref says nothing. With the store, the audit resolves the ref and checks
the stored ids against it. `pipeline_src.methods.export` never copies this folder. Torch-free.
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_src.plan.private_workspace import DP_STUDY_MARK
from pipeline_src.plan.provenance_key import STORE, key_path, keyed_digest, make_key, read_key
from pipeline_src.store.atomic import write_parquet


def results_root_of(path: str | os.PathLike) -> Path:
    """The results folder a model file lives in: its nearest ancestor that is a study's folder
    (`results/<experiment>`, which holds `prepare/`), holds a provenance store (a results folder
    copied under another name), or is named `results`."""
    for base in Path(path).resolve().parents:
        if base.name == "results" or (base / STORE / "key").is_file() or (base / "prepare").is_dir():
            return base
    raise FileNotFoundError(f"{path} is not inside a results folder (no ancestor named 'results' or holding "
                            f"'{STORE}/key')")


def _key(root: Path, create: bool) -> bytes:
    if create:
        return make_key(root)
    key = read_key(root)
    if key is None:
        raise FileNotFoundError(f"no provenance key {key_path(root)}: this results folder's DP memberships cannot be read")
    return key


membership_ref = keyed_digest  # HMAC-SHA256(key, sorted ids)


def store_members(root: str | os.PathLike, ids: list[str]) -> str:
    """Keep `ids` in the store of results folder `root`; return the keyed ref a record may hold."""
    root = Path(root)
    ref = membership_ref(_key(root, create=True), ids)
    path = root / STORE / "members" / f"{ref}.parquet"
    if not path.is_file():  # 0600 whatever the umask, like the key: the ids are the secret
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_parquet(pa.table({"sample_id": pa.array(sorted(ids), pa.string())}), path, mode=0o600)
    return ref


def load_members(root: str | os.PathLike, ref: str) -> list[str]:
    """The member ids behind `ref`, checked against it (a changed file is refused)."""
    root = Path(root)
    path = root / STORE / "members" / f"{ref}.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"provenance: no members file {path} for ref {ref[:12]}…")
    ids = pq.read_table(path).column("sample_id").to_pylist()
    if not hmac.compare_digest(membership_ref(_key(root, create=False), ids), ref):
        raise ValueError(f"provenance: {path} does not match its ref (changed after training)")
    return ids


def is_dp_study(root: str | os.PathLike) -> bool:
    """Whether results folder `root` is a DP study's: marked by a run with `privacy.enabled`, or,
    for a folder from before the mark, holding a provenance key or DP models (`private/`)."""
    root = Path(root)
    return (root / STORE / DP_STUDY_MARK).is_file() or (root / STORE / "key").is_file() or (root / "private").is_dir()
