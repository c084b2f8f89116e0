"""ImageFolder surprises are reported at validation (issue 15, item 5)."""
from __future__ import annotations

import re

import pytest

from pipeline_src.plan.config import ConfigError, validate_config


def folder_cfg(root, **dataset) -> dict:
    return {"experiment": "x", "dataset": {"source": "imagefolder", "path": str(root), "img_size": 8, **dataset},
            "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224"},  # class names are not digits
            "methods": {"fc": {"kind": "fc"}}, "shards": [1]}


def test_an_empty_class_folder_is_an_error_naming_it(image_folder):
    (image_folder / "hexagon").mkdir()
    (image_folder / "hexagon" / "notes.txt").write_text("no images here")
    with pytest.raises(ConfigError, match=r"config key 'dataset\.path'.*\['hexagon'\].*allow_empty_classes"):
        validate_config(folder_cfg(image_folder))


def test_allowed_empty_classes_are_dropped_and_said(image_folder, capsys):
    (image_folder / "hexagon").mkdir()
    cfg = validate_config(folder_cfg(image_folder, allow_empty_classes=True))
    assert cfg["dataset"]["allow_empty_classes"] is True
    err = capsys.readouterr().err
    assert "dataset imagefolder: 3 classes" in err and "empty class folders dropped: ['hexagon']" in err


def test_validation_reports_classes_images_per_split_and_skipped_files(image_folder, capsys):
    (image_folder / "README.md").write_text("about the data")
    (image_folder / "circle" / "labels.csv").write_text("a,b")
    (image_folder / "square" / ".DS_Store").write_bytes(b"\0")
    cfg = validate_config(folder_cfg(image_folder))
    assert cfg["dataset"]["allow_empty_classes"] is False  # the schema's default
    err = capsys.readouterr().err
    m = re.search(r"dataset imagefolder: 3 classes; target 3 classes, train/val/test (\d+)/(\d+)/(\d+) images; "
                  r"3 non-image files skipped", err)
    assert m, err
    assert sum(map(int, m.groups())) == 18  # 3 classes x 6 images, no other file counted


def test_digits_summary_has_both_tasks(capsys):
    validate_config({"experiment": "x", "dataset": {"source_classes": [0, 1, 2, 3, 4]},
                     "methods": {"fc": {"kind": "fc"}}, "shards": [1]})
    err = capsys.readouterr().err
    m = re.search(r"dataset digits: 10 classes; target 5 classes, train/val/test (\d+)/(\d+)/(\d+) images; "
                  r"source 5 classes, train/val/test (\d+)/(\d+)/(\d+) images", err)
    assert m, err
    assert sum(map(int, m.groups())) == 1797
