import copy

import pytest
import yaml

from pipeline_src.plan.config import ConfigError, validate_config
from tests.conftest import REPO

DEFAULT = yaml.safe_load((REPO / "config.yaml").read_text())


def test_default_config_is_valid_and_gets_defaults():
    cfg = validate_config(DEFAULT)
    assert cfg["train"]["weight_decay"] == 0.0
    assert cfg["dataset"]["in_chans"] == 1
    assert cfg["seeds"] == [0]


@pytest.mark.parametrize("mutate, key", [
    (lambda c: c.update(shard=[2]), "<top level>"),                          # unknown key (typo)
    (lambda c: c["train"].update(epochs="ten"), "train.epochs"),               # wrong type
    (lambda c: c["methods"]["nlft-1"].update(k=0), "methods.nlft-1.k"),        # out of range
    (lambda c: c["methods"]["fc"].update(kind="lora"), "methods.fc.kind"),     # unknown enum
    (lambda c: c["methods"]["nlft-1"].update(k=9), "methods.nlft-1.k"),        # deeper than backbone
    (lambda c: c.update(shards=[2, 100000]), "shards"),                        # more shards than samples
    (lambda c: c["backbone"]["arch"].update(num_heads=5), "backbone.arch.num_heads"),
    (lambda c: c["methods"]["fc"].update(kappa=3.0), "methods.fc.kappa"),        # option of another kind
    (lambda c: c["methods"]["taft-1"].update(loss="hinge"), "methods.taft-1.loss"),
    (lambda c: c.update(compose_weights="fisher"), "compose_weights"),
    (lambda c: c["dataset"].update(source="imagefolder", path="/nonexistent"), "dataset.path"),
])
def test_bad_config_names_the_key(mutate, key):
    cfg = copy.deepcopy(DEFAULT)
    mutate(cfg)
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        validate_config(cfg)


@pytest.mark.parametrize("value", ["all", 0, 2.5])
def test_a_key_of_several_types_names_every_allowed_value(value):
    """The schema's own message for `test_limit_per_class` ('all' does not match '^same$') named
    neither null nor integers."""
    cfg = copy.deepcopy(DEFAULT)
    cfg["dataset"]["test_limit_per_class"] = value
    with pytest.raises(ConfigError, match=r"config key 'dataset.test_limit_per_class': .* \(allowed: an integer ≥ 1, "
                                          r"null or 'same'\)$"):
        validate_config(cfg, count_samples=False)


@pytest.mark.parametrize("device, cache, shards, resolved", [
    ("auto", "auto", None, True), ("cpu", "auto", None, True), ("cpu", "auto", [1], True),
    ("cuda", "auto", None, True),  # the default study's shards train vectorized, from the cache (issue 41)
    ("cuda", "auto", [1], False),  # nothing vectorizes: the prefix is recomputed on a GPU
    ("cuda", True, [1], True), ("cpu", False, None, False), ("cuda", "false", None, False),  # explicit values win
])
def test_feature_cache_auto_recomputes_the_prefix_on_a_gpu_only_where_nothing_vectorizes(device, cache, shards,
                                                                                       resolved):
    cfg = copy.deepcopy(DEFAULT)
    cfg["device"] = device
    cfg.setdefault("features", {})["cache"] = cache
    if shards:  # the side studies read their own N: off, so that N = 1 is the only training
        cfg.update(shards=shards, fusion={"enabled": False}, forget={"study": {"enabled": False}},
                   privacy={"enabled": False})
    assert validate_config(cfg, count_samples=False)["features"]["cache"] is resolved


@pytest.mark.parametrize("name, why", [
    ("-rf", "no option like '-rf'"),        # was accepted; `query --study -rf` then failed in argparse
    (".hidden", "no hidden folder"),
    ("..", "no hidden folder"),
    ("a/b", "letters, digits"),
    ("x" * 300, "has 300 characters; a study's name has at most 100"),  # was OSError: File name too long
    ("benchmarks", "is taken"),
])
def test_experiment_is_a_folder_name(name, why):
    """Issue 44, 5.7: `experiment` is validated as a folder name before any job, naming the key."""
    cfg = copy.deepcopy(DEFAULT)
    cfg["experiment"] = name
    with pytest.raises(ConfigError, match="config key 'experiment'") as err:
        validate_config(cfg, count_samples=False)
    assert why in str(err.value) and len(str(err.value)) < 300


@pytest.mark.parametrize("name", ["tiny", "Tiny", "digits-transfer", "_x", "a.b", "x" * 100])
def test_ordinary_experiment_names_are_valid(name):
    cfg = copy.deepcopy(DEFAULT)
    cfg["experiment"] = name
    assert validate_config(cfg, count_samples=False)["experiment"] == name
