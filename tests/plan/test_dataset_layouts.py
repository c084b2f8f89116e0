"""Dataset layouts (`dataset.layout`): split folders and CSV/Parquet manifests, and their errors."""
from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.samples import assign_splits, list_samples


def study(path, **dataset) -> dict:
    return {"experiment": "x", "dataset": {"source": "imagefolder", "path": str(path), "img_size": 8, **dataset},
            "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224"},
            "methods": {"fc": {"kind": "fc"}}, "shards": [1]}


def _png(path: Path, seed: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (12, 12), dtype=np.uint8)).save(path)


@pytest.fixture
def split_root(tmp_path: Path) -> Path:
    """train/ 2 classes x 4, val/ 2 x 1, test/ 2 x 2; the same file name in every split."""
    root = tmp_path / "pets"
    for split, n in (("train", 4), ("val", 1), ("test", 2)):
        for c in ("cat", "dog"):
            for i in range(n):
                _png(root / split / c / f"img{i}.png", hash((split, c, i)) % 1000)
    return root


def table_of(cfg: dict) -> dict:
    d = validate_config(cfg)["dataset"]
    return assign_splits(list_samples(d), d, 0).to_pydict()


def test_split_folders_are_used_as_given(split_root, capsys):
    t = table_of(study(split_root, layout="split_folders", val_fraction=0.3))  # fractions are ignored
    by_id = dict(zip(t["sample_id"], t["split"]))
    assert len(by_id) == 14 and by_id["pets/train/cat/img0.png"] == "train"
    assert by_id["pets/val/dog/img0.png"] == "val" and by_id["pets/test/dog/img1.png"] == "test"
    assert all(i.split("/")[1] == s for i, s in by_id.items())
    assert dict(zip(t["sample_id"], t["label"]))["pets/test/dog/img0.png"] == 1
    err = capsys.readouterr().err
    assert "dataset imagefolder (split_folders): 2 classes; target 2 classes, train/val/test 8/2/4 images" in err
    assert "splits as given" in err


def test_split_folders_without_val_and_with_an_unknown_folder(split_root):
    shutil.rmtree(split_root / "val")
    assert set(table_of(study(split_root, layout="split_folders"))["split"]) == {"train", "test"}
    (split_root / "valid").mkdir()
    with pytest.raises(ConfigError, match=r"'dataset.layout'.*\['train', 'val', 'test'\].*\['valid'\]"):
        validate_config(study(split_root, layout="split_folders"))
    shutil.rmtree(split_root / "valid")
    shutil.rmtree(split_root / "test")
    with pytest.raises(ConfigError, match=r"needs a 'test/' folder"):
        validate_config(study(split_root, layout="split_folders"))


def test_a_class_missing_from_train_is_named(split_root):
    _png(split_root / "test" / "bird" / "a.png", 1)
    with pytest.raises(ConfigError, match=r"class 'bird' has test images but no training image"):
        validate_config(study(split_root, layout="split_folders"))


def write_manifest(path: Path, rows: list[list[str]], header=("path", "label", "split")) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_csv_and_parquet_manifests_agree(split_root):
    files = sorted((split_root).rglob("*.png"))
    rows = [[f.relative_to(split_root).as_posix(), f.parent.name, f.parts[-3]] for f in files]
    rows[0][0] = str(files[0])  # an absolute path is its own id
    csv_path = write_manifest(split_root / "manifest.csv", rows)
    t = table_of(study(csv_path, layout="manifest"))
    assert t["sample_id"][0] == files[0].as_posix() and t["sample_id"][1] == f"pets/{rows[1][0]}"
    assert t["split"] == [r[2] for r in rows] and t["class_name"] == [r[1] for r in rows]
    pq.write_table(pa.table({"path": [r[0] for r in rows], "label": [r[1] for r in rows],
                             "split": [r[2] for r in rows]}), split_root / "manifest.parquet")
    assert table_of(study(split_root / "manifest.parquet", layout="manifest")) == t


def test_manifest_without_split_draws_a_keyed_split(image_folder):
    rows = [[f"{c}/img{i}.png", c] for c in ("circle", "square", "triangle") for i in range(6)]
    path = write_manifest(image_folder / "m.csv", rows, header=("path", "label"))
    t = table_of(study(path, layout="manifest"))
    folders = table_of(study(image_folder))  # the same ids (root name/...) give the same keyed split
    assert t["sample_id"] == folders["sample_id"] and t["split"] == folders["split"]


@pytest.mark.parametrize("rows, header, message", [
    ([["circle/img0.png", "circle"]], ("file", "label"), r"m\.csv: no 'path' column"),
    ([["circle/img0.png", "circle"], ["circle/nope.png", "circle"]], ("path", "label"),
     r"m\.csv: row 2: image file not found: .*circle/nope\.png"),
    ([["circle/img0.png", "circle", "train"], ["circle/img1.png", "circle", "holdout"]], ("path", "label", "split"),
     r"row 2: unknown split 'holdout'"),
    ([["circle/img0.png", "circle"], ["./circle/img0.png", "circle"]], ("path", "label"),
     r"rows 1 and 2 name the same image"),
    ([["circle/img0.png", ""]], ("path", "label"), r"row 1 has an empty label"),
])
def test_manifest_errors_name_the_file_and_row(image_folder, rows, header, message):
    path = write_manifest(image_folder / "m.csv", rows, header=header)
    with pytest.raises(ConfigError, match=message):
        validate_config(study(path, layout="manifest"))


def test_manifest_path_must_be_a_csv_or_parquet_file(image_folder):
    with pytest.raises(ConfigError, match=re.escape("config key 'dataset.path': manifest file not found")):
        validate_config(study(image_folder, layout="manifest"))
    (image_folder / "m.txt").write_text("path,label\n")
    with pytest.raises(ConfigError, match=r"a manifest is a \.csv or \.parquet file"):
        validate_config(study(image_folder / "m.txt", layout="manifest"))


def test_layout_keys_need_an_imagefolder():
    with pytest.raises(ConfigError, match=r"config key 'dataset.layout': only for dataset.source 'imagefolder'"):
        validate_config({"experiment": "x", "dataset": {"layout": "manifest", "source_classes": [0]}, "methods": {"fc": {"kind": "fc"}},
                         "shards": [1]})


def test_a_spreadsheet_csv_with_a_byte_order_mark(image_folder):
    path = image_folder / "m.csv"
    path.write_text("path,label\ncircle/img0.png,circle\nsquare/img0.png,square\n", encoding="utf-8-sig")
    d = {"source": "imagefolder", "layout": "manifest", "path": str(path)}
    assert list_samples(d).class_names == ["circle", "square"]
