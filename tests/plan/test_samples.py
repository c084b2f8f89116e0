import pytest
import torch

from pipeline_src.data.images import load_images
from pipeline_src.plan.config import validate_config
from pipeline_src.plan.dataset_layouts import LAYOUTS
from pipeline_src.plan.samples import assign_splits, count_train_samples, list_samples


def folder_cfg(root, **kw):
    return {"source": "imagefolder", "path": str(root), "img_size": 8, "in_chans": 1, "val_fraction": 0.0,
            "test_fraction": 0.34, "source_classes": [], **kw}


def test_image_folder_ids_splits_and_images(image_folder):
    cfg = folder_cfg(image_folder)
    samples = list_samples(cfg)
    assert samples.sample_ids[0] == "shapes/circle/img0.png" and len(samples.sample_ids) == 18
    table = assign_splits(samples, cfg, seed=0).to_pydict()
    assert set(table["split"]) <= {"train", "test"} and "train" in table["split"]
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
    with pytest.raises(ValueError, match=r"1 image\(s\) do not decode, e.g. \S*shapes/circle/broken.png"):
        list_samples(cfg)  # when the DAG is built
    with pytest.raises(ValueError, match="sample shapes/circle/broken.png"):
        load_images(LAYOUTS["folders"](cfg), cfg)  # and the loader, for a file that broke later


def test_imagefolder_study_config_counts_samples(image_folder):
    cfg = validate_config({"experiment": "x", "dataset": {"source": "imagefolder", "path": str(image_folder)},
                           "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224"},
                           "methods": {"fc": {"kind": "fc"}}, "shards": [2]})
    t = assign_splits(list_samples(cfg["dataset"]), cfg["dataset"], cfg["seed"]).to_pydict()
    assert count_train_samples(cfg) == t["split"].count("train") > 0


def test_split_fractions_hold_per_class_in_expectation():
    cfg = {"source": "digits", "img_size": 8, "in_chans": 1, "val_fraction": 0.1, "test_fraction": 0.3,
           "source_classes": []}
    t = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    for c in set(t["class_name"]):  # ~180 samples per class: binomial sd of the test share ≈ 0.034
        splits = [s for s, n in zip(t["split"], t["class_name"]) if n == c]
        assert abs(splits.count("test") / len(splits) - 0.3) < 0.12
        assert abs(splits.count("val") / len(splits) - 0.1) < 0.08


def test_adding_or_removing_samples_moves_no_other_sample(image_folder):
    cfg = folder_cfg(image_folder, val_fraction=0.2)
    before = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    (image_folder / "circle" / "img0.png").unlink()
    for k in range(5):
        (image_folder / "square" / f"new{k}.png").write_bytes((image_folder / "square" / "img1.png").read_bytes())
    after = assign_splits(list_samples(cfg), cfg, seed=0).to_pydict()
    old = dict(zip(before["sample_id"], before["split"]))
    new = dict(zip(after["sample_id"], after["split"]))
    assert set(old) - set(new) == {"shapes/circle/img0.png"} and len(set(new) - set(old)) == 5
    assert all(new[i] == old[i] for i in set(old) & set(new))


def test_digits_labels_equal_scikit_learns_without_importing_it():
    from sklearn.datasets import load_digits

    from pipeline_src.plan.samples import digits_labels

    assert digits_labels() == load_digits().target.tolist()


def test_limit_per_class_selects_the_digits_rows_it_keeps():
    import numpy as np

    from pipeline_src.plan.samples import split_and_limit

    cfg = {"source": "digits", "img_size": 8, "in_chans": 1, "val_fraction": 0.1, "test_fraction": 0.3,
           "source_classes": [0], "limit_per_class": 7, "source_limit_per_class": 2}
    kept = split_and_limit(list_samples(cfg), cfg, seed=0)
    t = assign_splits(kept, cfg, seed=0).to_pydict()
    assert len(t["sample_id"]) == 9 * 7 * 3 + 2 * 3  # every class has more than 7 per split
    everything = load_images(list_samples(cfg | {"limit_per_class": None, "source_limit_per_class": None}), cfg)
    assert np.array_equal(load_images(kept, cfg).numpy(), everything.numpy()[kept.source_rows])


def test_validation_lists_the_dataset_once_for_the_dag_and_again_when_validated_again(image_folder, monkeypatch):
    # Validation and the DAG's plans (forget requests, shard manifests) share one listing per
    # (dataset, seed): the Fashion study's dry run drew its ~140,000 keyed hashes twice before.
    from pipeline_src.plan.forget import samples_table

    calls = []
    list_folders = LAYOUTS["folders"]
    monkeypatch.setitem(LAYOUTS, "folders", lambda cfg: calls.append(1) or list_folders(cfg))  # counts listings
    cfg = validate_config({"experiment": "x", "dataset": {"source": "imagefolder", "path": str(image_folder)},
                           "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224"},
                           "methods": {"fc": {"kind": "fc"}}, "shards": [2]})
    table = samples_table(cfg)
    assert len(calls) == 1 and table.num_rows == 18  # the DAG reads the table validation drew
    (image_folder / "circle" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="broken.png"):
        count_train_samples(cfg)  # a new validation lists the files as they are now
