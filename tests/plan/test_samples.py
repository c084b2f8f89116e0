import pytest
import torch

from pipeline_src.data.images import load_images
from pipeline_src.plan.config import validate_config
from pipeline_src.plan.samples import assign_splits, count_train_samples, list_samples


def folder_cfg(root, **kw):
    return {"source": "imagefolder", "path": str(root), "img_size": 8, "in_chans": 1, "val_fraction": 0.0,
            "test_fraction": 0.34, "source_classes": [], **kw}


def test_image_folder_ids_splits_and_images(image_folder):
    cfg = folder_cfg(image_folder)
    samples = list_samples(cfg)
    assert samples.sample_ids[0] == "shapes/circle/img0.png" and len(samples.sample_ids) == 18
    table = assign_splits(samples, cfg, seed=0).to_pydict()
    for c in ("circle", "square", "triangle"):  # stratified: 2 of 6 per class in test
        assert sum(s == "test" and n == c for s, n in zip(table["split"], table["class_name"])) == 2
    assert sorted(set(table["label"])) == [0, 1, 2]
    images = load_images(samples, cfg)
    assert images.shape == (18, 1, 8, 8) and images.dtype == torch.uint8
    assert assign_splits(samples, cfg, seed=0) == assign_splits(list_samples(cfg), cfg, seed=0)


def test_source_classes_are_disjoint_and_relabelled(image_folder):
    cfg = folder_cfg(image_folder, source_classes=["square"])
    t = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    target = {(n, lab) for n, lab, tk in zip(t["class_name"], t["label"], t["task"]) if tk == "target"}
    assert target == {("circle", 0), ("triangle", 1)}


def test_unreadable_image_names_the_sample(image_folder):
    (image_folder / "circle" / "broken.png").write_bytes(b"not a png")
    cfg = folder_cfg(image_folder)
    with pytest.raises(ValueError, match="sample shapes/circle/broken.png"):
        load_images(list_samples(cfg), cfg)


def test_imagefolder_study_config_counts_samples(image_folder):
    cfg = validate_config({"experiment": "x", "dataset": {"source": "imagefolder", "path": str(image_folder)},
                           "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224"},
                           "methods": {"fc": {"kind": "fc"}}, "shards": [2]})
    assert count_train_samples(cfg) == 18 - 6 - 3  # 30% test, 10% val (rounded per class)
