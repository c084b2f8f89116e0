"""The IDX reader (`dataset.source: idx`) against hand-made IDX files, good and bad, and against
Debian's Fashion-MNIST when it is installed (`apt-get install dataset-fashion-mnist`; required,
not skipped, when PIPELINE_REQUIRE_FASHION_MNIST=1, as in CI)."""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from pipeline_src.plan import idx_files
from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.idx_files import (
    IdxBadMagic,
    IdxCountMismatch,
    IdxMissingFile,
    IdxTruncated,
    list_idx,
    read_split,
)
from pipeline_src.plan.samples import assign_splits, list_samples, split_and_limit

FASHION = Path(idx_files.DEFAULT_PATH)
NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def idx_bytes(array: np.ndarray, magic: int | None = None) -> bytes:
    """An IDX file written from the format's definition: 0, 0, type 0x08, ndim, big-endian dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) if magic is None else struct.pack(">I", magic)
    return header + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()


def write(path: Path, data: bytes, gz: bool) -> None:
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)


def make_idx(root: Path, n_train: int = 30, n_test: int = 12, classes: int = 3, gz: bool = True,
             rows: int = 5, cols: int = 4) -> dict[str, np.ndarray]:
    """Both splits' files with random images and labels cycling over `classes`; returns the arrays."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        images = rng.integers(0, 256, (n, rows, cols), dtype=np.uint8)
        labels = (np.arange(n) % classes).astype(np.uint8)
        write(root / f"{prefix}-images-idx3-ubyte", idx_bytes(images), gz)
        write(root / f"{prefix}-labels-idx1-ubyte", idx_bytes(labels), gz)
        out[f"{split}_images"], out[f"{split}_labels"] = images, labels
    return out


def idx_cfg(root: Path, **kw) -> dict:
    return {"source": "idx", "path": str(root), "img_size": 4, "in_chans": 1, "val_fraction": 0.2,
            "test_fraction": 0.3, "source_classes": [], "class_names": [], **kw}


@pytest.mark.parametrize("gz", [True, False])
def test_good_files_gzip_or_raw(tmp_path, gz):
    arrays = make_idx(tmp_path, gz=gz)
    train = read_split(tmp_path, "train")
    assert train.images.dims == (30, 5, 4) and train.images.offset == 16 and train.images.gz == gz
    assert np.array_equal(train.labels, arrays["train_labels"])
    blocks = list(idx_files.image_blocks(train.images, 7))  # streamed in blocks of 7 images
    assert [s for s, _ in blocks] == [0, 7, 14, 21, 28]
    assert np.array_equal(np.concatenate([b for _, b in blocks]), arrays["train_images"])
    samples = list_idx(idx_cfg(tmp_path))
    assert samples.sample_ids[:2] == ["train/00000", "train/00001"] and samples.sample_ids[30] == "test/00000"
    assert samples.class_names[:4] == ["0", "1", "2", "0"] and samples.class_order == ["0", "1", "2"]


def test_gzip_is_detected_by_content_not_name(tmp_path):
    make_idx(tmp_path, gz=False)
    raw = tmp_path / "train-labels-idx1-ubyte"
    raw.write_bytes(gzip.compress(raw.read_bytes()))  # gzip content under the raw name
    assert read_split(tmp_path, "train").labels.tolist() == [i % 3 for i in range(30)]


def test_images_written_to_the_store_are_the_files_pixels(tmp_path):
    from pipeline_src.data.images import write_images

    arrays = make_idx(tmp_path / "d", rows=4, cols=4)
    cfg = idx_cfg(tmp_path / "d", limit_per_class=3)
    samples = split_and_limit(list_samples(cfg), cfg, seed=0)
    assert write_images(samples, cfg, tmp_path / "images.npy") == (len(samples.sample_ids), 1, 4, 4)
    stored = np.load(tmp_path / "images.npy")
    everything = np.concatenate([arrays["train_images"], arrays["test_images"]])
    assert np.array_equal(stored[:, 0], everything[samples.source_rows])  # img_size = file size: no resize


def test_splits_names_and_source_classes(tmp_path):
    make_idx(tmp_path, n_train=200, n_test=40)
    cfg = idx_cfg(tmp_path, class_names=["cat", "dog", "ant"], source_classes=[1, "ant"])
    t = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    split_of = dict(zip(t["sample_id"], t["split"]))
    assert all(split_of[f"test/{i:05d}"] == "test" for i in range(40))  # the official test split, as given
    train_splits = [split_of[f"train/{i:05d}"] for i in range(200)]
    assert set(train_splits) == {"train", "val"} and 20 <= train_splits.count("val") <= 60  # 0.2 of 200
    assert {(c, tk, lab) for c, tk, lab in zip(t["class_name"], t["task"], t["label"])} == {
        ("cat", "target", 0), ("dog", "source", 0), ("ant", "source", 1)}


def test_limit_per_class_is_per_class_and_split_and_stable(tmp_path):
    make_idx(tmp_path, n_train=300, n_test=60)
    cfg = idx_cfg(tmp_path, source_classes=[2], limit_per_class=5, source_limit_per_class=None)
    t = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    counts: dict = {}
    for c, s in zip(t["class_name"], t["split"]):
        counts[c, s] = counts.get((c, s), 0) + 1
    assert all(v == 5 for (c, _), v in counts.items() if c != "2") and len(counts) == 9
    assert counts["2", "train"] > 50  # the source class keeps its samples
    assert t == assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()  # deterministic
    twice = split_and_limit(split_and_limit(list_samples(cfg), cfg, 0), cfg, 0)
    assert twice.sample_ids == t["sample_id"]  # idempotent: prepare and the parse select the same samples
    other = assign_splits(list_samples(cfg), cfg, seed=1).to_pydict()["sample_id"]
    assert other != t["sample_id"]  # the key is the seed


@pytest.mark.parametrize("test_limit, per_class_test", [(None, 20), (8, 8), ("same", 5)])
def test_the_test_split_has_its_own_limit(tmp_path, test_limit, per_class_test):
    """dataset.test_limit_per_class (issue 42 §1): null keeps every target test image, an integer caps
    the test split alone, `same` (the default) is limit_per_class; train and val stay capped, the
    splits stay disjoint, and a larger test limit keeps the smaller one's test images (same hash)."""
    make_idx(tmp_path, n_train=300, n_test=60)  # 20 test images per class
    cfg = idx_cfg(tmp_path, source_classes=[2], limit_per_class=5, test_limit_per_class=test_limit)
    t = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    counts: dict = {}
    for c, s in zip(t["class_name"], t["split"]):
        counts[c, s] = counts.get((c, s), 0) + 1
    for c in ("0", "1"):  # the target classes
        assert (counts[c, "train"], counts[c, "val"], counts[c, "test"]) == (5, 5, per_class_test)
    assert counts["2", "test"] == 20 and counts["2", "train"] > 50  # the source class: no limit
    ids = {s: {i for i, x in zip(t["sample_id"], t["split"]) if x == s} for s in ("train", "val", "test")}
    assert len(t["sample_id"]) == len(set(t["sample_id"])) and not (ids["train"] & ids["val"])
    assert all(i.startswith("test/") for i in ids["test"]) and not any(i.startswith("test/") for i in ids["train"])
    capped = assign_splits(list_samples(cfg), {**cfg, "test_limit_per_class": "same"}, seed=0).to_pydict()
    same = {i for i, x in zip(capped["sample_id"], capped["split"]) if x != "test"}
    assert same == ids["train"] | ids["val"]  # train and val are the same images at any test limit
    assert {i for i, x in zip(capped["sample_id"], capped["split"]) if x == "test"} <= ids["test"]


def test_validation_accepts_good_files_and_fills_the_default_path(tmp_path, monkeypatch):
    make_idx(tmp_path, n_train=60, n_test=20)
    cfg = validate_config({"experiment": "x", "dataset": {"source": "idx", "path": str(tmp_path), "img_size": 4,
                                                          "source_classes": [0]},
                           "backbone": {"arch": {"patch_size": 2}},
                           "methods": {"fc": {"kind": "fc"}}, "shards": [2]})
    assert cfg["dataset"]["path"] == str(tmp_path)
    monkeypatch.setattr(idx_files, "DEFAULT_PATH", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="IdxMissingFile"):
        validate_config({"experiment": "x", "dataset": {"source": "idx", "source_classes": [0]},
                         "methods": {"fc": {"kind": "fc"}}, "shards": [2]})


def _validate(root: Path, cache_dir: Path | None = None) -> None:
    """Validation as a test calls it (no cache: every file read whole), or as a parse does (`cache_dir`)."""
    try:
        validate_config({"experiment": "x", "dataset": {"source": "idx", "path": str(root), "img_size": 4,
                                                        "source_classes": [0]},
                         "backbone": {"arch": {"patch_size": 2}}, "methods": {"fc": {"kind": "fc"}}, "shards": [1]},
                        cache_dir=cache_dir)
    finally:
        idx_files.use_cache_dir(None)


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


BAD = {  # name -> (how the good files are spoiled, the error, a part of its message)
    "missing file": (lambda r: (r / "t10k-labels-idx1-ubyte.gz").unlink(), IdxMissingFile, "t10k-labels-idx1-ubyte"),
    "labels where images belong": (
        lambda r: (r / "train-images-idx3-ubyte.gz").write_bytes((r / "train-labels-idx1-ubyte.gz").read_bytes()),
        IdxBadMagic, "magic number 2049"),
    "not IDX at all": (lambda r: (r / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"PK\3\4 a zip")),
                       IdxBadMagic, "first two bytes"),
    "int32 type byte": (lambda r: write(r / "train-labels-idx1-ubyte",
                                        bytes([0, 0, 0x0C, 1]) + struct.pack(">I", 30) + bytes(120), True),
                        IdxBadMagic, "type byte 0x0c"),
    "counts differ": (lambda r: write(r / "train-labels-idx1-ubyte", idx_bytes(np.zeros(29, np.uint8)), True),
                      IdxCountMismatch, "30 images but"),
    "gzip stream cut": (lambda r: _cut(r / "train-images-idx3-ubyte.gz", 200), IdxTruncated, "train-images"),
    "raw data short": (lambda r: write(r / "t10k-images-idx3-ubyte",
                                       idx_bytes(np.zeros((12, 5, 4), np.uint8))[:-7], True),
                       IdxTruncated, "233 data bytes, the header promises 240"),
    "header cut": (lambda r: write(r / "t10k-labels-idx1-ubyte", bytes([0, 0, 8, 1, 0]), True),
                   IdxTruncated, "ends inside its header"),
    "bytes beyond the header's dims": (lambda r: write(r / "t10k-labels-idx1-ubyte",
                                                       idx_bytes(np.zeros(12, np.uint8)) + b"\0", True),
                                       IdxTruncated, "more bytes than"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_fail_validation_with_a_named_error(tmp_path, case):
    make_idx(tmp_path)
    spoil, error, message = BAD[case]
    spoil(tmp_path)
    with pytest.raises(error, match=message):
        read_split(tmp_path, "test" if "t10k" in message or case in ("raw data short", "header cut",
                                                                     "bytes beyond the header's dims") else "train")
    for cache_dir in (None, tmp_path / "plan_cache"):  # the same error at parse time
        with pytest.raises(ConfigError, match=f"dataset.path': {error.__name__}: .*{message}"):
            _validate(tmp_path, cache_dir)


def test_class_names_must_fit_the_labels(tmp_path):
    make_idx(tmp_path)
    with pytest.raises(ValueError, match="dataset.class_names': 2 names for the labels 0..2"):
        list_idx(idx_cfg(tmp_path, class_names=["a", "b"]))
    with pytest.raises(ValueError, match="dataset.source_classes': label 7"):
        assign_splits(list_samples(idx_cfg(tmp_path, class_names=["a", "b", "c"], source_classes=[7])),
                      idx_cfg(tmp_path, class_names=["a", "b", "c"], source_classes=[7]), 0)


def test_validation_imports_no_torch(tmp_path):
    import subprocess
    import sys

    make_idx(tmp_path)
    code = ("import sys; from tests.plan.test_idx_files import _validate; from pathlib import Path; "
            f"_validate(Path({str(tmp_path)!r})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"


def require_fashion_mnist() -> None:
    """Skip without Debian's package; fail instead when PIPELINE_REQUIRE_FASHION_MNIST=1 (CI)."""
    if (FASHION / "train-images-idx3-ubyte.gz").is_file():
        return
    message = f"Fashion-MNIST not in {FASHION}: apt-get install dataset-fashion-mnist"
    if os.environ.get("PIPELINE_REQUIRE_FASHION_MNIST") == "1":
        pytest.fail(message + " (PIPELINE_REQUIRE_FASHION_MNIST=1)")
    pytest.skip(message)


def test_real_fashion_mnist_files():
    require_fashion_mnist()
    train, test = read_split(FASHION, "train"), read_split(FASHION, "test")
    assert train.images.dims == (60000, 28, 28) and test.images.dims == (10000, 28, 28)
    assert np.bincount(train.labels).tolist() == [6000] * 10 and np.bincount(test.labels).tolist() == [1000] * 10
    assert train.labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]  # the published first labels
    first = next(idx_files.image_blocks(train.images, 1))[1][0]
    assert first.shape == (28, 28) and first.max() == 255 and first[0, 0] == 0  # an ankle boot on black
    cfg = idx_cfg(FASHION, class_names=NAMES, source_classes=["Trouser", "Sandal", "Sneaker", "Bag", "Ankle boot"],
                  val_fraction=0.1)
    t = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    target_train = sum(tk == "target" and s == "train" for tk, s in zip(t["task"], t["split"]))
    assert len(t["sample_id"]) == 70000 and 26500 < target_train < 27500  # 30,000 less ~10 % val


def test_images_are_resized_as_image_files_are(tmp_path):
    from PIL import Image

    from pipeline_src.data.images import load_images

    arrays = make_idx(tmp_path, rows=6, cols=6)
    cfg = idx_cfg(tmp_path, img_size=3, in_chans=3)
    images = load_images(list_samples(cfg), cfg).numpy()
    assert images.shape == (42, 3, 3, 3)
    first = np.asarray(Image.fromarray(arrays["train_images"][0]).resize((3, 3), Image.BILINEAR))
    assert all(np.array_equal(images[0, c], first) for c in range(3))  # grey repeated over the channels


def _count_whole_reads(monkeypatch) -> list[str]:
    whole: list[str] = []
    check_whole = idx_files._checked_length.__wrapped__  # uncached: every whole read counts
    monkeypatch.setattr(idx_files, "_checked_length", lambda *a: whole.append(a[0]) or check_whole(*a))
    return whole


def test_parse_time_trusts_the_length_record_and_prepare_reads_every_file_whole(tmp_path, monkeypatch):
    # Reading Fashion-MNIST whole was 0.3 CPU-s of every cold dry run: at parse time a file passes
    # on its header and its recorded length (gzip's ISIZE trailer, a raw file's size); `prepare`
    # (no cache folder) still reads it whole and finds what only that finds, a bad CRC.
    make_idx(tmp_path / "data", rows=28, cols=28)  # random pixels: stored deflate blocks, bytes as written
    whole = _count_whole_reads(monkeypatch)
    images = tmp_path / "data" / "train-images-idx3-ubyte.gz"
    data = bytearray(images.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a pixel flipped: the length record still fits, the CRC does not
    images.write_bytes(bytes(data))
    idx_files.use_cache_dir(tmp_path / "plan_cache")
    try:
        assert read_split(tmp_path / "data", "train").images.dims == (30, 28, 28)
        assert whole == []
    finally:
        idx_files.use_cache_dir(None)
    with pytest.raises(IdxTruncated, match="train-images.*corrupt"):
        read_split(tmp_path / "data", "train")
    assert whole == [str(images)]
    # `prepare` itself, in a process whose parse set the cache: it refuses the file, writing nothing
    from pipeline_src.runner.step_args import Paths, StepArgs
    from pipeline_src.steps import prepare

    cfg = validate_config({"experiment": "x", "dataset": idx_cfg(tmp_path / "data", img_size=28, source_classes=[0]),
                           "backbone": {"arch": {"patch_size": 4}}, "methods": {"fc": {"kind": "fc"}}, "shards": [1]},
                          cache_dir=tmp_path / "plan_cache")  # a parse: passes, and leaves its cache set
    out = tmp_path / "results" / "prepare" / "samples.parquet"
    args = StepArgs(output=Paths([str(out)], {"samples": str(out)}), params={"settings": cfg}, rule="prepare")
    with pytest.raises(IdxTruncated, match="train-images.*corrupt"):
        prepare.main(args)
    assert not out.exists() and len(whole) == 2
    idx_files.use_cache_dir(None)


@pytest.mark.parametrize("gz", [True, False])
def test_length_record_fails_on_a_cut_or_overlong_file(tmp_path, gz):
    make_idx(tmp_path, gz=gz)
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    header = idx_files.read_header(str(tmp_path / name), idx_files.IMAGES_MAGIC)
    assert idx_files.length_on_record(header)
    full = (tmp_path / name).read_bytes()
    for spoiled in (full[:-1], full + b"\0"):
        (tmp_path / name).write_bytes(spoiled)
        assert not idx_files.length_on_record(header)


def test_a_multi_member_gzip_is_read_whole_once_and_its_pass_kept(tmp_path, monkeypatch):
    # Its trailer counts the last member only, so the record disagrees; the whole read passes it,
    # and the parse cache keeps that per (size, mtime, ctime): any write brings the read back.
    make_idx(tmp_path / "data")
    labels = tmp_path / "data" / "train-labels-idx1-ubyte.gz"
    raw = gzip.decompress(labels.read_bytes())
    labels.write_bytes(gzip.compress(raw[:10]) + gzip.compress(raw[10:]))  # a valid stream of two members
    cache = tmp_path / "plan_cache"
    cache.mkdir()
    whole = _count_whole_reads(monkeypatch)
    idx_files.use_cache_dir(cache)
    try:
        first = read_split(tmp_path / "data", "train")
        assert whole == [str(labels)] and (cache / idx_files.CACHE_FILE).is_file()
        again = read_split(tmp_path / "data", "train")
        assert len(whole) == 1 and again.images == first.images and (again.labels == first.labels).all()
        _cut(labels, len(labels.read_bytes()) - 20)  # same cache, new file: read whole, and refused
        with pytest.raises(IdxTruncated, match="train-labels"):
            read_split(tmp_path / "data", "train")
        assert len(whole) == 2
    finally:
        idx_files.use_cache_dir(None)
