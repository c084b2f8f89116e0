"""Each converted rule's `settings` param (`plan/step_settings.py`): what its step reads of the config,
so Snakemake's params trigger reruns a job when a key it reads changes, and only then."""
from __future__ import annotations

import copy
import pickle
import re
from types import SimpleNamespace

import pytest
import yaml

from pipeline_src.plan.config import validate_config
from pipeline_src.plan.job_settings import train_settings
from pipeline_src.plan.privacy import DP_SETTINGS
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
STUDY_NLFT = {"method": "nlft-1", "shards": "3", "seed": "0"}
STUDY_TAFT = {**STUDY_NLFT, "method": "taft-1"}
REQUEST = {"fraction": "0.3", "request": "0"}
ABLATION = {"method": "taft-1", "variant": "fig2_loss-rsl_pt-T_cls-F", "seed": "0"}
PRIVATE = {"protocol": "ours", "method": "taft-1", "regime": "fc", "eps": "1", "shards": "2", "seed": "0", "shard": "0"}

# (rule, wildcards, a key the rule does not read, a key it reads, that key's new value)
CASES = [
    ("compose", {}, "train.epochs", "compose_weights", "size"),
    ("evaluate_shards", {"shards": "1"}, "compose_weights", "experiment", "renamed"),  # no ensemble at N = 1
    ("evaluate_shards", {"shards": "2"}, "train.eval_batch_size", "compose_weights", "size"),  # its ensemble's
    ("prepare", {}, "train.epochs", "dataset.limit_per_class", 7),
    ("prepare", {}, "train.epochs", "dataset.test_limit_per_class", None),  # issue 42: every test image
    ("baseline_small_cnn", {"seed": "1"}, "train.lr", "search.lrs", [0.1]),  # its own grid, not the methods' lr
    ("baseline_small_cnn", {"seed": "1"}, "train.num_workers", "train.schedule", {"name": "cosine"}),
    ("pretrain", {}, "train.epochs", "backbone.pretrain", {"epochs": 3}),
    ("features", {}, "train.num_workers", "features.dtype", "bfloat16"),
    ("fusion_match", FUSE, "fusion.regmean_alpha", "fusion.match_ffn", False),
    ("fuse", {**FUSE, "fusion": "soup"}, "fusion.regmean_alpha", "fusion.blocks", "all"),
    ("fuse", {**FUSE, "fusion": "regmean"}, "fusion.fisher_samples", "fusion.regmean_alpha", 0.5),
    ("train", TRAIN, "methods.fc", "methods.nlft-1", {"kind": "nlft", "k": 2}),
    ("train", TRAIN, "train.num_workers", "train.lr", 0.5),
    ("train_vectorized_taft-1-vec_n2_s0", {"seed": "0", "shards": "2", "method": "taft-1-vec"}, "compose_weights", "seed", 3),
    ("fusion_train", TRAIN, "device", "train.batch_size", 3),
    ("report", {}, "train.num_workers", "methods", {"fc": {"kind": "fc"}}),
    ("unlearn_drop", STUDY_NLFT, "train.lr", "compose_weights", "size"),  # sisa-drop weighs the shards
    ("unlearn_drop", STUDY_TAFT, "compose_weights", "methods.taft-1", {"kind": "taft", "k": 2}),  # subtract: not
    ("unlearn_retrain", {**STUDY_TAFT, **REQUEST}, "fusion.blocks", "compose_weights", "size"),
    ("unlearn_retrain", {**STUDY_TAFT, **REQUEST}, "methods.nlft-1", "train.lr", 0.5),
    ("unlearn_paragon", {**STUDY_TAFT, **REQUEST}, "compose_weights", "train.epochs", 3),
    # taft-1's non-linear paragon is the config's nlft-1: its settings, not fc's
    ("unlearn_paragon_nonlinear", {**STUDY_TAFT, **REQUEST}, "compose_weights", "methods.nlft-1",
     {"kind": "nlft", "k": 1, "lr": 0.5}),
    ("ablation", ABLATION, "compose_weights", "train.batch_size", 3),
    ("train_private", PRIVATE, "train.lr", "privacy.delta", 1e-6),  # a DP job trains with `privacy:`
    ("train_private", PRIVATE, "privacy.paper", "privacy.jvp_only", True),  # ours: jvp_only applies to taft
    ("train_private", {**PRIVATE, "method": "fc"}, "privacy.jvp_only", "privacy.train_head", False),
    ("train_private", {**PRIVATE, "protocol": "paper"}, "privacy.jvp_only", "privacy.paper",
     {"epochs": 7, "lr": None, "micro_batch_size": None, "methods": [], "regimes": []}),
    ("train_private", PRIVATE, "privacy.epsilons", "privacy.public_train_size", 500),  # ε: the epsilon param
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


def test_a_neutral_key_at_its_neutral_value_is_in_no_settings_nor_signature(cfg):
    """`dataset.test_limit_per_class: same` (the default) is the behaviour before the key existed:
    prepare's settings and the dataset signature leave it out, so adding it reran no study."""
    from pipeline_src.plan.step_settings import dataset_signature

    assert cfg["dataset"]["test_limit_per_class"] == "same"
    assert "test_limit_per_class" not in settings_for("prepare", cfg)["dataset"]
    assert "test_limit_per_class" not in dataset_signature(cfg)
    assert cfg["dataset"]["test_limit_per_class"] == "same"  # the config itself keeps it
    every = changed(cfg, "dataset.test_limit_per_class", None)
    assert settings_for("prepare", every)["dataset"]["test_limit_per_class"] is None
    assert dataset_signature(every)["test_limit_per_class"] is None


def test_the_job_config_gives_load_job_the_configs_train_block(cfg):
    """The records' `train_settings` (train_settings of the job config) are the config's own."""
    job = job_config(settings_for("train", cfg, TRAIN), run_only_settings(cfg))
    method = cfg["methods"]["nlft-1"]
    assert train_settings(job, method) == train_settings(cfg, method)
    assert job["device"] == cfg["device"] and job["seed"] == cfg["seed"]


def test_unknown_rules_and_missing_keys_are_named(cfg):
    assert not converted("no_such_rule") and converted("train_vectorized_taft-1-vec_n2_s0")
    with pytest.raises(SettingsError, match="rule 'no_such_rule' has no settings"):
        settings_for("no_such_rule", cfg)
    with pytest.raises(SettingsError, match=r"rule 'train' reads config key 'methods.nope'"):
        settings_for("train", cfg, {**TRAIN, "method": "nope"})
    bare = {k: v for k, v in cfg.items() if k != "compose_weights"}
    with pytest.raises(SettingsError, match=r"rule 'compose' reads config key 'compose_weights'"):
        settings_for("compose", bare)


def test_every_converted_rule_has_settings_for_the_tiny_study(cfg):
    wild = {**FUSE, **TRAIN, **REQUEST, **PRIVATE, "method": "taft-1", "fusion": "fisher", "cache": "last1",
            "variant": ABLATION["variant"]}
    for rule in RULE_KEYS:
        assert isinstance(settings_for(rule, cfg, wild), dict)


def test_every_rule_with_a_step_is_converted_and_passes_its_settings():
    """No step reads the whole config: each rule that runs one is in RULE_KEYS and its `params:`
    carry `settings=` (the rerun trigger holds what the step reads)."""
    from tests.test_steps import rules_with_runs

    rules = rules_with_runs()
    assert {"train_private", "unlearn_drop", "unlearn_paragon_nonlinear", "ablation"} <= set(rules)
    assert [r for r in rules if not converted(r)] == []
    text = "\n".join(p.read_text() for p in sorted((REPO / "workflow" / "rules").glob("*.smk")))
    blocks = [b for b in re.split(r"\n(?=\s*rule\b)", text) if re.search(r"\brun:\s*\n\s*run_job\(", b)]
    assert len(blocks) == len(rules)
    for block in blocks:
        assert re.search(r"params:(.|\n)*\bsettings=", block), block.strip().splitlines()[0]
    steps = REPO / "pipeline_src" / "steps"
    assert [str(p) for p in steps.rglob("*.py") if "args.config" in p.read_text()] == []


def test_the_nonlinear_paragons_settings_hold_the_method_it_trains(cfg):
    s = settings_for("unlearn_paragon_nonlinear", cfg, {**STUDY_TAFT, **REQUEST})
    assert s["methods"] == {m: cfg["methods"][m] for m in ("nlft-1", "taft-1")}  # the studied one, its paragon
    alone = {**cfg, "methods": {"taft-1": cfg["methods"]["taft-1"]}}  # no nlft-1: the counterpart is derived
    assert settings_for("unlearn_paragon_nonlinear", alone, {**STUDY_TAFT, **REQUEST})["methods"] == alone["methods"]


def test_a_dp_jobs_settings_hold_public_privacy_settings_only(cfg):
    """train_private's params (kept in .snakemake/metadata) carry no member, no count of the data
    and nothing of `forget:` or `dataset:`: the DP settings, the declared public size, the method."""
    s = settings_for("train_private", changed(cfg, "forget.requests", "requests.csv"), PRIVATE)
    assert set(s) == {"experiment", "seed", "methods", "privacy"}
    assert s["methods"] == {"taft-1": cfg["methods"]["taft-1"]}
    assert set(s["privacy"]) == {*DP_SETTINGS, "public_train_size", "jvp_only"}
    paper = settings_for("train_private", cfg, {**PRIVATE, "protocol": "paper"})
    assert set(paper["privacy"]) == {*DP_SETTINGS, "public_train_size", "paper"}  # jvp_only: always, in paper
    assert paper["privacy"]["paper"] == {"epochs": cfg["privacy"]["paper"]["epochs"], "lr": cfg["privacy"]["paper"]["lr"]}
    # privacy.paper.micro_batch_size: neutral at null (micro-batches of privacy.batch_size, as before the key)
    micro = settings_for("train_private", changed(cfg, "privacy.paper.micro_batch_size", 256), {**PRIVATE, "protocol": "paper"})
    assert micro["privacy"]["paper"]["micro_batch_size"] == 256
    assert "jvp_only" not in settings_for("train_private", cfg, {**PRIVATE, "method": "fc"})["privacy"]


def test_a_key_missing_from_the_settings_is_named_with_the_rule(cfg):
    """A converted step reads its job config (`StepArgs.job_config`); a key its settings lack raises
    at once, naming the rule and the key, at any depth (a step may not fall back on a default)."""
    from pipeline_src.runner.step_args import StepArgs

    args = StepArgs(params={"settings": settings_for("unlearn_paragon", cfg, STUDY_TAFT)}, wildcards=STUDY_TAFT,
                    rule="unlearn_paragon", config=NoConfig("unlearn_paragon"), runtime=run_only_settings(cfg))
    job = args.job_config()
    assert job["train"]["lr"] == cfg["train"]["lr"] and job["device"] == cfg["device"]
    with pytest.raises(KeyError, match=r"rule 'unlearn_paragon' reads config key 'compose_weights'"):
        job["compose_weights"]
    with pytest.raises(KeyError, match=r"rule 'unlearn_paragon' reads config key 'methods.nlft-1'"):
        job["methods"]["nlft-1"]
    again = pickle.loads(pickle.dumps(job))  # the fork server pickles what a step holds
    assert again == job
    with pytest.raises(KeyError, match=r"'unlearn_paragon' reads config key 'privacy.delta'"):
        again["privacy"]["delta"]


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
    assert from_snakemake(smk("no_such_rule")).config == cfg  # a rule without settings: the whole config
