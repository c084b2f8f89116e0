"""MNIST-family IDX files (`dataset.source: idx`): headers checked and labels read at validation,
images streamed by `prepare`.

The format (LeCun's MNIST page; Fashion-MNIST, KMNIST and EMNIST use it too): a big-endian header
of two zero bytes, a type byte (0x08 = uint8, the only type these datasets use), the number of
dimensions, then one uint32 per dimension; the data follow in C order. The images file's magic
number is 2051 (0x00000803: uint8, 3 dimensions), the labels file's 2049 (0x00000801). A file is
read through gzip when it starts with gzip's own magic bytes, whatever its name.

A folder holds `train-{images-idx3,labels-idx1}-ubyte` and `t10k-...` (each optionally `.gz`).
The official train/test split is kept: train-* samples are `train/<index>` (val is drawn from
them by the keyed hash, `plan/samples.py`), t10k-* samples are `test/<index>`.

Every error is a subclass of `IdxError` named after what is wrong and naming the file, so that
validation (`plan/config.py`) refuses a study before any job runs. Parse time: no torch.
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from pipeline_src.plan.cache import read_entry, write_entry
from pipeline_src.plan.dataset_layouts import SampleList

DEFAULT_PATH = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist package
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
UBYTE = 0x08
GZIP_MAGIC = b"\x1f\x8b"
PREFIXES = {"train": "train", "test": "t10k"}  # split -> file prefix
CACHE_FILE = "idx_check.json"  # in the parse cache: files read whole because their length record disagreed
READ_BYTES = 1 << 20  # one streamed read: bounds the buffers, whatever the file's size


class IdxError(ValueError):
    """An IDX dataset that cannot be used; the subclass names what is wrong."""


class IdxMissingFile(IdxError):
    """A file the layout needs is not in `dataset.path`."""


class IdxBadMagic(IdxError):
    """The header is not the expected IDX header (magic number, type byte or dimensions)."""


class IdxCountMismatch(IdxError):
    """The images and labels files hold different numbers of samples."""


class IdxTruncated(IdxError):
    """The file holds fewer (or more) data bytes than its header promises, or its gzip stream ends early."""


@dataclass(frozen=True)
class IdxHeader:
    """One file's header.

    Args:
        path: the file.
        dims: its dimensions, samples first.
        offset: bytes before the data (in the decompressed stream).
        gz: whether the file is gzip-compressed.
    """

    path: str
    dims: tuple[int, ...]
    offset: int
    gz: bool

    @property
    def data_bytes(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64))  # uint8: one byte per value


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_stream(path: str) -> BinaryIO:
    """The file's decompressed bytes, read sequentially (gzip by content, not by name)."""
    return gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb")


def read_header(path: str, magic: int) -> IdxHeader:
    """Parse and check one file's header.

    Args:
        path: the IDX file (raw or gzip).
        magic: the expected magic number (IMAGES_MAGIC or LABELS_MAGIC).

    Raises:
        IdxBadMagic: another magic number, type byte or number of dimensions.
        IdxTruncated: the file ends inside its header.
    """
    want = "images (2051)" if magic == IMAGES_MAGIC else "labels (2049)"
    try:
        with open_stream(path) as f:
            head = f.read(4)
            if len(head) < 4:
                raise IdxTruncated(f"{path}: {len(head)} bytes, shorter than an IDX header")
            found = struct.unpack(">I", head)[0]
            if head[:2] != b"\0\0" or head[2] != UBYTE or found != magic:
                raise IdxBadMagic(f"{path}: magic number {found} (0x{found:08x}), expected {want}: "
                                  f"{_describe(head)}")
            ndim = head[3]
            raw = f.read(4 * ndim)
    except (EOFError, OSError, zlib.error) as e:
        if isinstance(e, FileNotFoundError):
            raise IdxMissingFile(f"{path}: not found") from None
        raise IdxTruncated(f"{path}: unreadable header ({type(e).__name__}: {e})") from None
    if len(raw) < 4 * ndim:
        raise IdxTruncated(f"{path}: ends inside its header ({len(raw)} of {4 * ndim} dimension bytes)")
    return IdxHeader(path, struct.unpack(f">{ndim}I", raw), 4 + 4 * ndim, _is_gzip(path))


def _describe(head: bytes) -> str:
    if head[:2] == GZIP_MAGIC:
        return "a gzip file that does not decompress to IDX"
    if head[:2] != b"\0\0":
        return "not an IDX file (the first two bytes are not zero)"
    if head[2] != UBYTE:
        return f"IDX type byte 0x{head[2]:02x}, only 0x08 (unsigned byte) is supported"
    kind = {IMAGES_MAGIC: "an images file", LABELS_MAGIC: "a labels file"}.get(struct.unpack(">I", head)[0])
    return kind or f"uint8 IDX with {head[3]} dimensions"


def data_chunks(header: IdxHeader, nbytes: int = READ_BYTES) -> Iterator[bytes]:
    """The data bytes after the header, in chunks of at most `nbytes` (streamed, never the whole file).

    Raises:
        IdxTruncated: the stream ends before `header.data_bytes` (a short file or a cut gzip stream).
    """
    left = header.data_bytes
    try:
        with open_stream(header.path) as f:
            f.read(header.offset)
            while left:
                block = f.read(min(nbytes, left))
                if not block:
                    break
                left -= len(block)
                yield block
    except (EOFError, OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise IdxTruncated(f"{header.path}: the data stream ends early or is corrupt after "
                           f"{header.data_bytes - left} of {header.data_bytes} bytes ({type(e).__name__}: {e})") from None
    if left:
        raise IdxTruncated(f"{header.path}: {header.data_bytes - left} data bytes, the header promises "
                           f"{header.data_bytes} ({' x '.join(map(str, header.dims))})")


@lru_cache(maxsize=16)
def _checked_length(path: str, size: int, mtime_ns: int, magic: int) -> IdxHeader:
    """The header, after reading the whole stream once to check its length and, for gzip, its CRC
    (cached per file version: a parse lists the dataset more than once). Bytes after the data are
    refused too: the header's dimensions would not describe the file."""
    header = read_header(path, magic)
    seen = 0
    try:
        with open_stream(path) as f:  # one pass; to the end, where gzip checks its CRC and length
            while block := f.read(READ_BYTES):
                seen += len(block)
    except (EOFError, OSError, zlib.error) as e:
        raise IdxTruncated(f"{path}: the data stream ends early or is corrupt after {max(seen - header.offset, 0)} of "
                           f"{header.data_bytes} bytes ({type(e).__name__}: {e})") from None
    extra = seen - header.offset - header.data_bytes
    if extra < 0:
        raise IdxTruncated(f"{path}: {seen - header.offset} data bytes, the header promises "
                           f"{header.data_bytes} ({' x '.join(map(str, header.dims))})")
    if extra:
        raise IdxTruncated(f"{path}: more bytes than its header's {' x '.join(map(str, header.dims))} uint8 values; "
                           "the header's dimensions do not describe the file")
    return header


_cache_dir: Path | None = None


def use_cache_dir(path: str | Path | None) -> None:
    """Parse-time checks (`checked_header`), keeping the passes of files read whole under `path`
    (the parse cache, `results/<experiment>/prepare/.plan_cache`, written only by a run that starts
    jobs); None, `prepare`'s way: every file read whole."""
    global _cache_dir
    _cache_dir = None if path is None else Path(path)


def length_on_record(header: IdxHeader) -> bool:
    """Whether the file's own record of its length fits the header, read without decompressing:
    a raw file's size, or a gzip file's trailer (ISIZE: the decompressed length mod 2**32, RFC 1952
    §2.3.1). A cut or overlong file fails it; a file that passes may still hold a bad deflate
    stream or CRC, which only reading it whole finds (`_checked_length`)."""
    want = header.offset + header.data_bytes
    if not header.gz:
        return os.path.getsize(header.path) == want
    with open(header.path, "rb") as f:
        if f.seek(0, os.SEEK_END) < 18:  # a gzip member's header and trailer alone are 18 bytes
            return False
        f.seek(-4, os.SEEK_END)
        return struct.unpack("<I", f.read(4))[0] == want % (1 << 32)


def checked_header(path: str, magic: int) -> IdxHeader:
    """`read_header`, and the data's length checked against it (IdxTruncated otherwise).

    At parse time (a cache folder set, `use_cache_dir`) a file passes on its header and
    `length_on_record`, without decompressing it: reading Fashion-MNIST whole took 0.3 CPU-s of
    every cold dry run. `prepare` sets no folder, so it reads every file whole, CRC included, before
    any other job uses the data. A file whose record disagrees is read whole here too, so that the
    error says how it is short; one that passes anyway (a gzip of several members, whose trailer
    counts the last member only) keeps its pass in the cache per size, mtime and ctime (any write
    changes the ctime).
    """
    if _cache_dir is not None:
        header = read_header(path, magic)
        if length_on_record(header):
            return header
    st = os.stat(path)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, magic]
    cache_path = None if _cache_dir is None else _cache_dir / CACHE_FILE
    passed: dict[str, list[int]] = {}
    if cache_path is not None:
        try:
            passed = dict(read_entry(cache_path)["passed"])
        except (OSError, ValueError, KeyError, TypeError):
            passed = {}
        if passed.get(path) == stamp:
            return read_header(path, magic)
    header = _checked_length(path, st.st_size, st.st_mtime_ns, magic)
    if cache_path is not None:
        write_entry({"passed": {**passed, path: stamp}}, cache_path)
    return header


def find_file(root: str | Path, prefix: str, kind: str) -> str:
    """`<root>/<prefix>-<kind>-ubyte` or its `.gz`.

    Args:
        root: `dataset.path`.
        prefix: `train` or `t10k`.
        kind: `images-idx3` or `labels-idx1`.
    """
    name = f"{prefix}-{kind}-ubyte"
    for candidate in (Path(root) / name, Path(root) / f"{name}.gz"):
        if candidate.is_file():
            return str(candidate)
    hint = " (apt-get install dataset-fashion-mnist)" if str(root) == DEFAULT_PATH else ""
    raise IdxMissingFile(f"{Path(root) / name}[.gz]: not found{hint}")


@dataclass(frozen=True)
class IdxSplit:
    """The checked files of one official split.

    Args:
        images: the images file's header (samples, rows, cols).
        labels: uint8 (n,) labels.
    """

    images: IdxHeader
    labels: np.ndarray


def read_split(root: str | Path, split: str) -> IdxSplit:
    """Check one split's two files and read its labels (the images stay on disk).

    Args:
        root: `dataset.path`.
        split: `train` or `test`.

    Raises:
        IdxError: a missing file, a wrong magic number, a truncated file, or counts that differ.
    """
    prefix = PREFIXES[split]
    images = checked_header(find_file(root, prefix, "images-idx3"), IMAGES_MAGIC)
    labels_h = checked_header(find_file(root, prefix, "labels-idx1"), LABELS_MAGIC)
    if len(images.dims) != 3 or len(labels_h.dims) != 1:  # the magic numbers fix these; kept for clarity
        raise IdxBadMagic(f"{images.path}: expected 3-D images and 1-D labels")
    if images.dims[0] != labels_h.dims[0]:
        raise IdxCountMismatch(f"{images.path} holds {images.dims[0]} images but {labels_h.path} "
                               f"{labels_h.dims[0]} labels")
    labels = np.frombuffer(b"".join(data_chunks(labels_h)), dtype=np.uint8)
    return IdxSplit(images, labels)


def image_blocks(header: IdxHeader, rows_per_block: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, uint8 (b, rows, cols)) blocks of an images file, in order, streamed.

    Args:
        header: the images file's header (`read_split(...).images`).
        rows_per_block: images per block (memory: this many images, not the file).
    """
    row_bytes = header.dims[1] * header.dims[2]
    buf, start = b"", 0
    for chunk in data_chunks(header, rows_per_block * row_bytes):
        buf += chunk
        n = len(buf) // row_bytes
        if n:
            yield start, np.frombuffer(buf[:n * row_bytes], np.uint8).reshape(n, *header.dims[1:])
            start += n
            buf = buf[n * row_bytes:]


def list_idx(dataset_cfg: dict) -> SampleList:
    """`dataset.source: idx`: every sample of both official splits, labels read, images left on disk.

    Sample ids are `train/<index>` and `test/<index>` (index in its file, 5 digits); class names
    are `dataset.class_names[label]`, or the label itself when none are given.

    Args:
        dataset_cfg: the `dataset` config (path, class_names).

    Raises:
        IdxError: a file missing, with a wrong magic number, truncated, or counts that differ.
        ValueError: class names that do not fit the labels (naming the key).
    """
    root = dataset_cfg.get("path") or DEFAULT_PATH
    splits = {s: read_split(root, s) for s in ("train", "test")}
    num_labels = 1 + max(int(sp.labels.max(initial=0)) for sp in splits.values())
    names = [str(n) for n in dataset_cfg.get("class_names") or []] or [str(i) for i in range(num_labels)]
    if len(names) != num_labels:
        raise ValueError(f"config key 'dataset.class_names': {len(names)} names for the labels 0..{num_labels - 1} "
                         f"of {splits['train'].images.path}")
    if len(set(names)) != len(names):
        raise ValueError("config key 'dataset.class_names': names repeat")
    ids: list[str] = []
    classes: list[str] = []
    given: list[str] = []
    for split, sp in splits.items():
        ids += [f"{split}/{i:05d}" for i in range(len(sp.labels))]
        classes += [names[y] for y in sp.labels.tolist()]
        given += [split] * len(sp.labels)
    missing = sorted(set(names) - set(classes[:len(splits["train"].labels)]))
    if missing:  # a class without a training image cannot be learned
        raise ValueError(f"config key 'dataset.path': classes {missing} have no training image in "
                         f"{splits['train'].images.path}")
    return SampleList(ids, classes, None, splits=given, source_rows=list(range(len(ids))), class_order=names,
                      val_from_train=True)
