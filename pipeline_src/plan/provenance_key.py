"""The provenance key of a results folder, and the digests of id lists it keys (torch-free).

    <results>/provenance/key    32 random bytes, owner-only from its first byte, made once per folder

It keys a DP model's `membership_ref` (`store/private_provenance.py`) and, in a DP study, the
workflow's rerun triggers built from id lists (`ids_digest`): the upstream signature's
`pretrain_data` and the `prepare` job's `listing`. A plain SHA-256 of sorted ids is a membership
oracle: whoever guesses a member list hashes it and compares (issue 43). Keyed, a digest still
changes exactly when the list does, and says nothing without the key.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from pipeline_src.store.atomic import make_temp

STORE = "provenance"
NO_KEY_YET = "no provenance key yet"  # a dry run before a DP study's first real run: it makes no key


def key_path(root: str | os.PathLike) -> Path:
    return Path(root) / STORE / "key"


def read_key(root: str | os.PathLike) -> bytes | None:
    """The key of results folder `root`, or None where it has none yet."""
    path = key_path(root)
    return path.read_bytes() if path.is_file() else None


def make_key(root: str | os.PathLike) -> bytes:
    """The key of results folder `root`, made first if it has none (0600 from its first byte).

    Args:
        root: the results folder (`results/<experiment>`).
    """
    path = key_path(root)
    if not path.is_file():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = make_temp(path)  # named after this process: a later run removes it if killed
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:  # link, not rename: the first of several parallel jobs wins, the others read its key
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_bytes()


def keyed_digest(key: bytes, ids: list[str]) -> str:
    """HMAC-SHA256 of the sorted ids under `key`."""
    return hmac.new(key, "\n".join(sorted(ids)).encode(), hashlib.sha256).hexdigest()


def ids_digest(ids: list[str], root: str | os.PathLike, private: bool) -> str:
    """A parse-time fingerprint of an id list for a rule's params or a signature file: it changes
    exactly when the list does, so Snakemake reruns what depends on it.

    Keyed with the provenance key wherever the results folder has one: a DP study's, whose run
    makes it before any params are read (common.smk), and a former DP study's (privacy switched
    off: still private workspace, and its triggers stay as they were). A DP study's dry run
    before its first real run makes nothing and gets `NO_KEY_YET` (such a study reruns everything
    anyway). A study that never had privacy on keeps the plain SHA-256
    (`plan/sharding.membership_digest`): a key would mark its folder as a DP study's
    (`store/private_provenance.is_dp_study`), and no DP model's members are there to confirm.

    Args:
        ids: the sample ids (any order).
        root: the study's results folder (`results/<experiment>`).
        private: whether the study has `privacy.enabled`.
    """
    key = read_key(root)
    if key is not None:
        return keyed_digest(key, ids)
    if private:
        return NO_KEY_YET
    from pipeline_src.plan.sharding import membership_digest

    return membership_digest(ids)
