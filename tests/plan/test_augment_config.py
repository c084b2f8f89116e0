"""`train.augment`, `train.precision`, `train.num_workers`, `train.eval_batch_size` at validation."""
from __future__ import annotations

import pytest

from pipeline_src.plan.config import ConfigError, validate_config


def study(methods: dict, cache: bool = False, **train) -> dict:
    return {"experiment": "x", "dataset": {"source_classes": [0, 1, 2, 3, 4]}, "methods": methods, "shards": [1],
            "features": {"cache": cache}, "train": {"augment": {"enabled": True}, **train}}


def test_defaults_keep_the_old_path():
    cfg = validate_config({"experiment": "x", "dataset": {"source_classes": [0]}, "methods": {"fc": {"kind": "fc"}},
                           "shards": [1]}, count_samples=False)
    assert cfg["train"]["num_workers"] == 0 and cfg["train"]["precision"] == "float32"
    assert cfg["train"]["eval_batch_size"] == 256
    assert cfg["train"]["augment"]["enabled"] is False and cfg["train"]["augment"]["scale"] == [0.08, 1.0]


def test_augmentation_trains_from_images():
    cfg = validate_config(study({"fc": {"kind": "fc"}, "taft-1": {"kind": "taft", "k": 1}, "full": {"kind": "full"}}),
                          count_samples=False)
    assert cfg["train"]["augment"]["hflip"] == 0.5
    validate_config(study({"full": {"kind": "full"}}, cache=True), count_samples=False)  # full has no cache


@pytest.mark.parametrize("methods, cache, message", [
    ({"taft-1": {"kind": "taft", "k": 1}}, True, r"methods.taft-1 trains from the cached features 'last1'.*"
                                                 r"features.cache: false"),
    ({"last": {"kind": "last", "rank": 4, "heads": 2}}, False, r"methods.last \(last\) trains from the frozen block"),
    ({"t": {"kind": "taft", "k": 1, "vectorized_shards": True}}, False, r"methods.t.vectorized_shards"),
])
def test_methods_that_cannot_augment_are_named(methods, cache, message):
    with pytest.raises(ConfigError, match=r"config key 'train.augment.enabled': " + message):
        validate_config(study(methods, cache), count_samples=False)


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match=r"config key 'train.precision'"):
        validate_config(study({"fc": {"kind": "fc"}}, precision="float16"), count_samples=False)
    with pytest.raises(ConfigError, match=r"config key 'train.augment.scale'"):
        validate_config(study({"fc": {"kind": "fc"}}, augment={"enabled": True, "scale": [0.5]}), count_samples=False)
    with pytest.raises(ConfigError, match=r"config key 'train.eval_batch_size'"):
        validate_config(study({"fc": {"kind": "fc"}}, eval_batch_size=0), count_samples=False)


def test_num_workers_and_eval_batch_size_rerun_nothing_precision_and_augment_do():
    from pipeline_src.plan.job_settings import training_signature

    def signature(**train) -> str:
        cfg = validate_config({"experiment": "x", "dataset": {"source_classes": [0]}, "features": {"cache": False},
                               "methods": {"fc": {"kind": "fc"}}, "shards": [1], "train": train}, count_samples=False)
        return training_signature(cfg, cfg["methods"]["fc"])

    base = signature()
    assert signature(num_workers=4) == base and signature(eval_batch_size=64) == base
    assert signature(precision="bfloat16") != base and signature(augment={"enabled": True}) != base
