"""Each converted rule's `settings` param (`plan/step_settings.py`): what its step reads of the config,
so Snakemake's params trigger reruns a job when a key it reads changes, and only then."""
from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

import pytest
import yaml

from pipeline_src.plan.config import validate_config
from pipeline_src.plan.job_settings import train_settings
from pipeline_src.plan.step_settings import (
    RULE_KEYS,
    SettingsError,
    converted,
    job_config,
    run_only_settings,
    settings_for,
)
from pipeline_src.runner.step_args import NoConfig, from_snakemake
from tests.conftest import REPO


@pytest.fixture(scope="module")
def cfg() -> dict:
    """The tiny `.test` study's validated config."""
    return validate_config(yaml.safe_load((REPO / ".test" / "config.yaml").read_text()), count_samples=False)


def changed(cfg: dict, path: str, value) -> dict:
    out = copy.deepcopy(cfg)
    *parents, leaf = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    assert leaf in node, path  # a key the config has: the change is real
    node[leaf] = value
    return out


FUSE = {"method": "nlft-1", "shards": "2", "seed": "0", "init": "random_reinit", "matching": "none"}
TRAIN = {"method": "nlft-1", "shards": "2", "seed": "0", "shard": "1"}

# (rule, wildcards, a key the rule does not read, a key it reads, that key's new value)
CASES = [
    ("compose", {}, "train.epochs", "compose_weights", "size"),
    ("evaluate_shard", {}, "compose_weights", "experiment", "renamed"),
    ("evaluate_ensemble", {}, "train.eval_batch_size", "compose_weights", "size"),
    ("prepare", {}, "train.epochs", "dataset.limit_per_class", 7),
    ("pretrain", {}, "train.epochs", "backbone.pretrain", {"epochs": 3}),
    ("features", {}, "train.num_workers", "features.dtype", "bfloat16"),
    ("fusion_match", FUSE, "fusion.regmean_alpha", "fusion.match_ffn", False),
    ("fuse", {**FUSE, "fusion": "soup"}, "fusion.regmean_alpha", "fusion.blocks", "all"),
    ("fuse", {**FUSE, "fusion": "regmean"}, "fusion.fisher_samples", "fusion.regmean_alpha", 0.5),
    ("train", TRAIN, "methods.fc", "methods.nlft-1", {"kind": "nlft", "k": 2}),
    ("train", TRAIN, "train.num_workers", "train.lr", 0.5),
    ("train_vectorized_taft-1-vec_n2", {"seed": "0", "method": "taft-1-vec"}, "compose_weights", "seed", 3),
    ("fusion_train", TRAIN, "device", "train.batch_size", 3),
    ("report", {}, "train.num_workers", "methods", {"fc": {"kind": "fc"}}),
]


@pytest.mark.parametrize("rule, wildcards, unused, used, value", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_a_key_a_rule_reads_changes_its_settings_and_another_does_not(cfg, rule, wildcards, unused, used, value):
    base = settings_for(rule, cfg, wildcards)
    assert settings_for(rule, changed(cfg, unused, 12345), wildcards) == base
    assert settings_for(rule, changed(cfg, used, value), wildcards) != base


def test_settings_are_the_configs_keys_nested_and_sorted(cfg):
    s = settings_for("train", cfg, TRAIN)
    assert s["methods"] == {"nlft-1": cfg["methods"]["nlft-1"]}  # only the job's method
    assert s["dataset"] == {"img_size": cfg["dataset"]["img_size"], "in_chans": cfg["dataset"]["in_chans"]}
    assert list(s) == sorted(s) and list(s["train"]) == sorted(s["train"])
    assert "num_workers" not in s["train"] and "eval_batch_size" not in s["train"]  # run-only: no rerun
    reordered = {k: cfg[k] for k in reversed(list(cfg))}
    assert repr(settings_for("train", reordered, TRAIN)) == repr(s)  # the params trigger compares reprs
    assert settings_for("report", cfg)["device"] == cfg["device"]  # a leaf named on purpose stays


def test_the_job_config_gives_load_job_the_configs_train_block(cfg):
    """The records' `train_settings` (train_settings of the job config) are the config's own."""
    job = job_config(settings_for("train", cfg, TRAIN), run_only_settings(cfg))
    method = cfg["methods"]["nlft-1"]
    assert train_settings(job, method) == train_settings(cfg, method)
    assert job["device"] == cfg["device"] and job["seed"] == cfg["seed"]


def test_unknown_rules_and_missing_keys_are_named(cfg):
    assert not converted("unlearn_drop") and converted("train_vectorized_taft-1-vec_n2")
    with pytest.raises(SettingsError, match="rule 'unlearn_drop' has no settings"):
        settings_for("unlearn_drop", cfg)
    with pytest.raises(SettingsError, match=r"rule 'train' reads config key 'methods.nope'"):
        settings_for("train", cfg, {**TRAIN, "method": "nope"})
    bare = {k: v for k, v in cfg.items() if k != "compose_weights"}
    with pytest.raises(SettingsError, match=r"rule 'compose' reads config key 'compose_weights'"):
        settings_for("compose", bare)


def test_every_converted_rule_has_settings_for_the_tiny_study(cfg):
    wild = {**FUSE, **TRAIN, "fusion": "fisher", "cache": "last1"}
    for rule in RULE_KEYS:
        assert isinstance(settings_for(rule, cfg, wild), dict)


@pytest.mark.parametrize("read", [
    lambda c: c["device"], lambda c: c.get("device"), lambda c: "device" in c, lambda c: list(c),
    lambda c: bool(c), lambda c: {**c}, lambda c: dict(c), lambda c: c.items(),
])
def test_a_converted_rule_is_handed_no_config(read):
    with pytest.raises(KeyError, match="rule 'compose' reads its settings from params"):
        read(NoConfig("compose"))


def test_the_runner_hands_converted_rules_their_settings_only(cfg):
    def smk(rule):
        return SimpleNamespace(input={}, output={}, params={"settings": {"compose_weights": "uniform"}}, wildcards={},
                               log={}, threads=1, resources={}, config=cfg, rule=rule)

    args = from_snakemake(smk("compose"))
    assert isinstance(args.config, NoConfig) and args.settings == {"compose_weights": "uniform"}
    assert args.runtime == {"device": cfg["device"], "num_workers": cfg["train"]["num_workers"],
                            "eval_batch_size": cfg["train"]["eval_batch_size"],
                            "private_workspace": cfg["privacy"]["enabled"]}
    again = pickle.loads(pickle.dumps(args))  # the fork server pickles it
    assert isinstance(again.config, NoConfig) and again.config.rule == "compose"
    assert from_snakemake(smk("unlearn_drop")).config == cfg  # not converted yet: the whole config
