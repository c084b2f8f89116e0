"""The keyed digests of id lists (`plan/provenance_key.py`, issue 43): a DP study's rerun triggers
change exactly when a list does, match HMAC-SHA256 built by hand from its definition (RFC 2104),
and no plain SHA-256 of the ids, wherever the folder has a key; no key is made where none is
asked for."""
from __future__ import annotations

import hashlib
import os
import stat

from pipeline_src.plan.provenance_key import NO_KEY_YET, ids_digest, key_path, make_key, read_key
from pipeline_src.plan.sharding import membership_digest
from pipeline_src.store.private_provenance import store_members

IDS = ["digits/0007", "digits/0001", "café/3"]


def _hmac_sha256(key: bytes, message: bytes) -> str:
    """RFC 2104 with SHA-256 (64-byte blocks), a reference independent of the `hmac` module."""
    key = key.ljust(64, b"\0")  # keys of at most 64 bytes are padded, not hashed
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in key) + message).digest()
    return hashlib.sha256(bytes(b ^ 0x5C for b in key) + inner).hexdigest()


def test_a_non_dp_study_keeps_the_plain_digest_and_makes_no_key(tmp_path):
    plain = hashlib.sha256("\n".join(sorted(IDS)).encode()).hexdigest()
    assert ids_digest(IDS, tmp_path, private=False) == membership_digest(IDS) == plain
    assert list(tmp_path.iterdir()) == []


def test_a_former_dp_study_keeps_its_keyed_digest(tmp_path):
    """Privacy switched off: the folder is still private workspace, and nothing reruns."""
    make_key(tmp_path)
    assert ids_digest(IDS, tmp_path, private=False) == ids_digest(IDS, tmp_path, private=True) != membership_digest(IDS)


def test_a_dp_study_without_a_key_says_so_and_writes_nothing(tmp_path):
    assert read_key(tmp_path) is None
    assert ids_digest(IDS, tmp_path, private=True) == NO_KEY_YET
    assert list(tmp_path.iterdir()) == []


def test_the_keyed_digest_is_hmac_sha256_and_changes_exactly_with_the_list(tmp_path):
    old = os.umask(0o022)
    try:
        key = make_key(tmp_path)
    finally:
        os.umask(old)
    assert len(key) == 32 and make_key(tmp_path) == key == read_key(tmp_path)  # made once
    assert stat.S_IMODE(key_path(tmp_path).stat().st_mode) == 0o600
    assert stat.S_IMODE(key_path(tmp_path).parent.stat().st_mode) == 0o700
    digest = ids_digest(IDS, tmp_path, private=True)
    assert digest == _hmac_sha256(key, "\n".join(sorted(IDS)).encode())
    assert digest != membership_digest(IDS) and digest != NO_KEY_YET
    assert ids_digest(list(reversed(IDS)), tmp_path, private=True) == digest  # a set: the order does not matter
    assert ids_digest(IDS[1:], tmp_path, private=True) != digest
    assert ids_digest([*IDS, "digits/0008"], tmp_path, private=True) != digest
    assert ids_digest(IDS, tmp_path / "other", private=True) == NO_KEY_YET  # another study, another key


def test_a_dp_models_ref_is_the_same_keyed_digest(tmp_path):
    """One key per results folder: the store's refs and the rerun triggers are the same function."""
    ref = store_members(tmp_path, IDS)
    assert ref == ids_digest(IDS, tmp_path, private=True)
