"""Corrupt images (`dataset.skip_corrupt`): found at listing, cached per file, or an error naming the path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_src.data.images import write_images
from pipeline_src.plan import image_check
from pipeline_src.plan.config import validate_config
from pipeline_src.plan.dataset_layouts import LAYOUTS
from pipeline_src.plan.samples import list_samples
from tests.conftest import REPO


def spoil(root: Path) -> tuple[Path, Path]:
    """A truncated PNG and a text file named .jpg in the `circle` class."""
    good = (root / "circle" / "img0.png").read_bytes()
    truncated = root / "circle" / "truncated.png"
    truncated.write_bytes(good[: len(good) // 2])
    text = root / "circle" / "notes.jpg"
    text.write_text("not an image")
    return truncated, text


def folder_cfg(root, **kw) -> dict:
    return {"source": "imagefolder", "path": str(root), "img_size": 8, "in_chans": 1, "val_fraction": 0.0,
            "test_fraction": 0.34, "source_classes": [], **kw}


@pytest.fixture(autouse=True)
def no_cache_dir():
    image_check.use_cache_dir(None)
    yield
    image_check.use_cache_dir(None)


def test_check_image_finds_truncated_and_non_images(image_folder):
    truncated, text = spoil(image_folder)
    assert image_check.check_image(str(image_folder / "circle" / "img1.png")) is None
    assert "truncated" in image_check.check_image(str(truncated))
    assert "UnidentifiedImageError" in image_check.check_image(str(text))


def test_without_skip_corrupt_the_listing_names_the_file(image_folder):
    """Found when the DAG is built, before `prepare` could fail and lose its old outputs (issue 24, item 3)."""
    truncated, _ = spoil(image_folder)
    (image_folder / "circle" / "notes.jpg").unlink()
    cfg = folder_cfg(image_folder)
    with pytest.raises(ValueError, match=rf"config key 'dataset.path': 1 image\(s\) do not decode, e.g. {truncated} "
                                         r"\(OSError: .*truncated.*skip_corrupt: true"):
        list_samples(cfg)
    truncated.unlink()
    assert len(list_samples(cfg).paths) == 18


def test_prepare_still_names_a_file_that_stopped_decoding_after_listing(image_folder, tmp_path):
    truncated, _ = spoil(image_folder)
    (image_folder / "circle" / "notes.jpg").unlink()
    cfg = folder_cfg(image_folder)
    samples = LAYOUTS["folders"](cfg)  # the listing alone, as if the file broke after validation
    with pytest.raises(ValueError, match=rf"sample shapes/circle/truncated.png: cannot read image {truncated}.*"
                                         r"skip_corrupt"):
        write_images(samples, cfg, tmp_path / "images.npy")
    assert not (tmp_path / "images.npy").exists()


def test_listing_decodes_without_importing_torch(image_folder, tmp_path):
    spoil(image_folder)
    code = ("import sys; from pipeline_src.plan import image_check; from pipeline_src.plan.samples import list_samples\n"
            f"image_check.use_cache_dir({str(tmp_path / 'cache')!r})\n"
            f"s = list_samples({folder_cfg(image_folder, skip_corrupt=True)!r})\n"
            "assert len(s.corrupt) == 2, s.corrupt\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_skip_corrupt_drops_them_from_the_listing(image_folder, tmp_path):
    truncated, text = spoil(image_folder)
    samples = list_samples(folder_cfg(image_folder, skip_corrupt=True))
    assert len(samples.sample_ids) == 18 and str(truncated) not in samples.paths
    assert [p for p, _ in samples.corrupt] == sorted([str(text), str(truncated)])
    assert write_images(samples, folder_cfg(image_folder), tmp_path / "images.npy") == (18, 1, 8, 8)


def test_verdicts_are_cached_per_file_and_rechecked_when_it_changes(image_folder, tmp_path, monkeypatch):
    truncated, text = spoil(image_folder)
    image_check.use_cache_dir(tmp_path / "cache")
    cfg = folder_cfg(image_folder, skip_corrupt=True)
    first = list_samples(cfg)
    entry = json.loads((tmp_path / "cache" / image_check.CACHE_FILE).read_text())
    assert len(entry["files"]) == 20 and entry["files"][str(text)][3].startswith("UnidentifiedImageError")
    checked = []
    real = image_check.check_image
    monkeypatch.setattr(image_check, "check_image", lambda p: checked.append(p) or real(p))
    assert list_samples(cfg) == first and checked == []  # a second parse decodes nothing
    truncated.write_bytes((image_folder / "circle" / "img0.png").read_bytes())  # repaired: size changes
    again = list_samples(cfg)
    assert checked == [str(truncated)] and "shapes/circle/truncated.png" in again.sample_ids
    assert [p for p, _ in again.corrupt] == [str(text)]


def test_a_file_changed_under_its_old_size_and_mtime_is_checked_again(image_folder, tmp_path):
    """The verdict's key holds the ctime (issue 33, item 7): contents replaced with size and mtime kept
    (`cp -p`, `rsync -t`), or permissions changed, move only the ctime."""
    image_check.use_cache_dir(tmp_path / "cache")
    cfg = folder_cfg(image_folder, skip_corrupt=True)
    good = image_folder / "circle" / "img1.png"
    assert good.stat().st_size > 16 and list_samples(cfg).corrupt == []
    st = good.stat()
    good.write_bytes(b"\0" * st.st_size)  # same size, not an image
    os.utime(good, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
    assert [p for p, _ in list_samples(cfg).corrupt] == [str(good)]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_a_file_made_unreadable_after_its_verdict_is_refused(image_folder, tmp_path):
    image_check.use_cache_dir(tmp_path / "cache")
    cfg = folder_cfg(image_folder, skip_corrupt=True)
    assert list_samples(cfg).corrupt == []
    target = image_folder / "circle" / "img1.png"
    target.chmod(0)
    try:
        assert [p for p, r in list_samples(cfg).corrupt] == [str(target)]
    finally:
        target.chmod(0o644)


def test_validation_reports_the_skipped_count(image_folder, capsys):
    spoil(image_folder)
    validate_config({"experiment": "x", "dataset": {**folder_cfg(image_folder, skip_corrupt=True)},
                     "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224"},
                     "methods": {"fc": {"kind": "fc"}}, "shards": [1]})
    assert "2 corrupt images skipped (e.g. " in capsys.readouterr().err


def test_a_class_left_without_images_is_an_error_unless_allowed(image_folder):
    for f in (image_folder / "square").iterdir():
        f.write_text("not an image")
    with pytest.raises(ValueError, match=r"'dataset.skip_corrupt': every image of classes \['square'\] is corrupt"):
        list_samples(folder_cfg(image_folder, skip_corrupt=True))
    samples = list_samples(folder_cfg(image_folder, skip_corrupt=True, allow_empty_classes=True))
    assert set(samples.class_names) == {"circle", "triangle"} and samples.empty_classes == ["square"]
