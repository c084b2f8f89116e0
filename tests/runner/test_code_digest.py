"""The job servers' code digest: equal to hashing every file, and read again whenever a file changed."""
import hashlib
import os
from pathlib import Path

import pytest

from pipeline_src.runner import code_digest as cd


def reference_digest(package: Path) -> str:
    """The digest as first written: every `*.py` file that rglob finds, hashed at each call."""
    h = hashlib.sha1()
    for f in sorted(package.rglob("*.py")):
        h.update(f.relative_to(package).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@pytest.fixture
def package(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg"
    (pkg / "sub" / "deeper").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "sub" / "b.py").write_text("B = 2\n")
    (pkg / "sub" / "deeper" / "c.py").write_text("C = 3\n")
    (pkg / "sub" / "notes.txt").write_text("not code")
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.py").write_text("X = 0\n")
    (pkg / "linked").symlink_to(outside, target_is_directory=True)  # rglob does not enter it
    cd._MEMO.clear()
    return pkg


def count_reads(monkeypatch) -> list[Path]:
    reads: list[Path] = []
    real = Path.read_bytes

    def read_bytes(self):
        reads.append(self)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    return reads


def test_the_digest_is_the_reference_and_lists_the_same_files(package: Path) -> None:
    assert cd.code_digest(package) == reference_digest(package)
    assert [parts for parts, _ in cd.python_files(package)] == [
        f.relative_to(package).parts for f in sorted(package.rglob("*.py"))]


def test_settled_files_are_not_read_again(package: Path, monkeypatch) -> None:
    monkeypatch.setattr(cd, "SETTLED_S", 0.0)
    first = cd.code_digest(package)
    reads = count_reads(monkeypatch)
    assert cd.code_digest(package) == first and reads == []


def test_recent_files_are_read_at_every_call(package: Path, monkeypatch) -> None:
    cd.code_digest(package)  # the files were written just now: nothing is kept
    reads = count_reads(monkeypatch)
    cd.code_digest(package)
    assert len(reads) == 4


@pytest.mark.parametrize("change", ["same size, mtime set back", "new file", "removed file", "renamed file"])
def test_any_change_gives_the_new_digest(package: Path, monkeypatch, change: str) -> None:
    monkeypatch.setattr(cd, "SETTLED_S", 0.0)
    before = cd.code_digest(package)
    b = package / "sub" / "b.py"
    if change == "same size, mtime set back":
        st = b.stat()
        b.write_text("B = 9\n")  # the ctime moves; it cannot be set back
        os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "new file":
        (package / "sub" / "d.py").write_text("")
    elif change == "removed file":
        b.unlink()
    else:
        b.rename(package / "sub" / "e.py")
    assert cd.code_digest(package) == reference_digest(package) != before
