"""The `privacy:` config section: infeasible or inconsistent studies fail at validation,
naming the key, and the feasibility check agrees with Opacus' own noise planner."""
from __future__ import annotations

import pytest
import yaml
from opacus.accountants.utils import get_noise_multiplier

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.privacy import (
    LARGEST_SIGMA_TRIED,
    check_privacy_config,
    epsilon_label,
    privacy_methods,
    shard_sizes,
)
from pipeline_src.plan.samples import count_train_samples
from tests.conftest import REPO

N_TRAIN = 538  # training split of the .test study


def tiny_config(**privacy) -> dict:
    """The .test study with the privacy section on, validated (defaults filled in)."""
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["privacy"] = {"enabled": True, "methods": ["nlft-1", "taft-1", "last"], "public_train_size": 500, **privacy}
    cfg.pop("search", None)  # the DP search's PT points: tests/plan/test_search.py
    return validate_config(cfg, count_samples=False)


def check(cfg: dict, n_train: int = N_TRAIN) -> None:
    check_privacy_config(cfg, n_train)


def test_default_study_section_is_valid_and_resolves_methods():
    cfg = tiny_config()
    check(cfg)
    assert cfg["privacy"]["epsilons"] == [1, 3, 8] and cfg["privacy"]["regimes"] == ["full", "bitfit", "layernorm", "fc"]
    cfg["privacy"]["methods"] = []
    resolved = privacy_methods(cfg)  # every method of a DP kind, in config order; never fc
    assert {"nlft-1", "taft-1", "last"} <= set(resolved) and "fc" not in resolved
    assert [m for m in cfg["methods"] if m in resolved] == resolved
    assert [epsilon_label(e) for e in (1, 3.0, 0.5, 8)] == ["1", "3", "0.5", "8"]
    n_train = count_train_samples(cfg)
    for n in (1, 2, 3):  # the sizes of the manifests the split step writes, over every seed
        sizes = shard_sizes(cfg, n)
        assert min(sizes) >= 1 and max(sizes) <= n_train and (n > 1 or sizes == [n_train])


@pytest.mark.parametrize("change,key", [
    (dict(methods=["nope"]), "privacy.methods[0]"),
    (dict(methods=["taft-1", "fc"]), "privacy.methods[1]"),
    (dict(delta=1 / 500), "privacy.delta"),
    (dict(epsilons=[1, 0.01]), "privacy.epsilons[1]"),
    (dict(batch_size=300, shards=[1, 2]), "privacy.batch_size"),
    (dict(shards=[1, 1000]), "privacy.shards[1]"),
])
def test_inconsistent_or_infeasible_study_names_the_key(change, key):
    cfg = tiny_config()
    cfg["privacy"].update(change)
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        check(cfg)


def test_disabled_study_checks_names_but_not_budgets():
    cfg = tiny_config(enabled=False)
    cfg["privacy"]["epsilons"] = [0.01]
    check(cfg)  # no budget is planned for a study that does not run
    cfg["privacy"]["methods"] = ["fc"]
    with pytest.raises(ConfigError, match=r"privacy.methods\[0\]"):
        check(cfg)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_feasibility_agrees_with_opacus_planner(accountant):
    """Around the least reachable ε, the check accepts exactly what get_noise_multiplier can plan."""
    from opacus.accountants import create_accountant

    cfg = tiny_config(epochs=2, batch_size=64, accountant=accountant, shards=[1])
    spe = -(-500 // 64)  # planned from the public size, never the true one
    acc = create_accountant(accountant)
    acc.history = [(LARGEST_SIGMA_TRIED, 1 / spe, 2 * spe)]
    floor = acc.get_epsilon(delta=1e-5)
    for eps, feasible in ((floor * 1.05, True), (floor * 0.95, False)):
        cfg["privacy"]["epsilons"] = [eps]
        if feasible:
            check(cfg)
            get_noise_multiplier(target_epsilon=eps, target_delta=1e-5, sample_rate=1 / spe, steps=2 * spe,
                                 accountant=accountant)
        else:
            with pytest.raises(ConfigError, match=r"privacy.epsilons\[0\].*infeasible"):
                check(cfg)
            with pytest.raises(ValueError, match="too low"):
                get_noise_multiplier(target_epsilon=eps, target_delta=1e-5, sample_rate=1 / spe, steps=2 * spe,
                                     accountant=accountant)


def test_validate_config_runs_the_privacy_check():
    raw = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    raw["privacy"] = {"enabled": True, "methods": ["taft-1"], "epsilons": [0.01], "public_train_size": 500}
    with pytest.raises(ConfigError, match=r"privacy.epsilons\[0\]"):
        validate_config(raw)
    raw["privacy"] = {"enabled": True, "methods": ["fc"]}
    with pytest.raises(ConfigError, match=r"privacy.methods\[0\]"):
        validate_config(raw, count_samples=False)


@pytest.mark.parametrize("change,key", [
    (dict(public_train_size=None), "privacy.public_train_size.*required when privacy.enabled"),
    (dict(public_train_size=5000), "privacy.public_train_size.*far from the training split"),
    (dict(paper={"methods": ["fc"]}), r"privacy.paper.methods\[0\]"),
    (dict(paper={"methods": ["taft-1"]}, mode="fast"), "privacy.mode"),
    (dict(protocol="paper", mode="hooks"), "privacy.mode"),
])
def test_paper_protocol_refusals_name_the_key(change, key):
    cfg = tiny_config()
    for k, v in change.items():
        cfg["privacy"][k] = {**cfg["privacy"][k], **v} if isinstance(v, dict) else v
    with pytest.raises(ConfigError, match=key):
        check(cfg)


def test_paper_protocol_jobs_settings_and_method_config():
    from pipeline_src.plan.privacy import dp_method_config, dp_settings, privacy_jobs

    cfg = tiny_config(regimes=["full", "bitfit"], paper={"methods": ["taft-1"], "regimes": ["fc", "full"]},
                      batch_size=400)  # a micro-batch under the paper protocol: larger than a shard is fine
    check(cfg)
    jobs = privacy_jobs(cfg)
    assert jobs[:6] == [("ours", m, r) for m in ("nlft-1", "taft-1", "last") for r in ("full", "bitfit")]
    assert jobs[6:] == [("paper", "taft-1", "fc"), ("paper", "taft-1", "full")]
    ours, paper = dp_settings(cfg, "ours"), dp_settings(cfg, "paper")
    assert paper["epochs"] == 50 and paper["lr"] == ours["lr"] and paper["full_batch"] and "full_batch" not in ours
    assert paper["micro_batch_size"] == 400 and "micro_batch_size" not in ours  # null: privacy.batch_size
    cfg["privacy"]["paper"]["micro_batch_size"] = 128
    assert dp_settings(cfg, "paper")["micro_batch_size"] == 128 and dp_settings(cfg, "ours")["batch_size"] == 400
    taft = {"kind": "taft", "k": 1, "loss": "rsl", "kappa": 10.0}
    assert dp_method_config(taft, "paper", None) == {"kind": "taft", "k": 1, "loss": "ce", "jvp_only": True}
    assert dp_method_config(taft, "ours", None) == taft and dp_method_config(taft, "ours", True)["jvp_only"] is True
    assert dp_method_config({"kind": "nlft", "k": 1}, "paper", None) == {"kind": "nlft", "k": 1}
    # a paper budget is planned over its own steps (q = 1, 50 steps): ε far below Poisson's reach fails
    cfg["privacy"]["epsilons"] = [0.05]
    with pytest.raises(ConfigError, match=r"privacy.epsilons\[0\].*50 steps at sampling rate 1"):
        check(cfg)


def test_release_model_files_are_the_models_behind_each_dp_metrics_file():
    from pipeline_src.plan.privacy import release_model_files

    base = "results/metrics/private/ours/last/fc/eps8"
    got = release_model_files([f"{base}/n1_s0/shard0.parquet", f"{base}/n2_s0/ensemble.parquet",
                               "results/metrics/private/ours/taft-1/fc/eps8/n2_s0/soup.parquet"], "results")
    want = ["results/private/ours/last/fc/eps8/n1_s0/shard0", "results/private/ours/last/fc/eps8/n2_s0/shard0",
            "results/private/ours/last/fc/eps8/n2_s0/shard1", "results/private/ours/taft-1/fc/eps8/n2_s0/soup"]
    assert got == sorted(f"{w}.{e}" for w in want for e in ("safetensors", "json"))
