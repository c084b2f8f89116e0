"""The `search:` section: the TAFT paper's grid expanded into methods (`plan/search.py`)."""
from __future__ import annotations

import pytest
import yaml

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.search import expand_search, grid, lr_tag, selection_targets, validation_targets
from tests.conftest import REPO


def _config(**search) -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["search"] = search
    return cfg


def test_lr_tags_are_short_and_distinct():
    assert [lr_tag(x) for x in (1e-3, 1e-4, 3e-4, 0.5, 2.5e-3)] == ["1e-3", "1e-4", "3e-4", "5e-1", "2p5e-3"]


def test_the_default_grid_is_the_papers():
    cfg = validate_config(_config(enabled=True, methods=["nlft-1", "taft-1"]), count_samples=False)
    assert cfg["search"]["lrs"] == [0.001, 0.0001]
    assert cfg["search"]["taft"] == {"pt": [True, False], "cls": [True, False]}
    assert cfg["search"]["nlft"] == {"cls": [True, False]}  # Table 4 chose CLS for NLFT-1 too
    # every point has its own name: the method's name stands for its selected point (plan/selected_point.py)
    assert [p["name"] for p in grid(cfg, "nlft-1")] == ["nlft-1_lr1e-3_clsT", "nlft-1_lr1e-3_clsF",
                                                        "nlft-1_lr1e-4_clsT", "nlft-1_lr1e-4_clsF"]
    names = [p["name"] for p in grid(cfg, "taft-1")]
    assert len(names) == 8 and "taft-1" not in names and names[1] == "taft-1_lr1e-3_ptT_clsF"
    assert "taft-1_lr1e-4_ptF_clsT" in names
    point = cfg["methods"]["taft-1_lr1e-4_ptF_clsT"]
    assert point == {**cfg["methods"]["taft-1"], "lr": 0.0001, "reset": True, "reset_cls": True}
    assert cfg["search"]["variants"]["taft-1_lr1e-4_ptF_clsT"] == {"base": "taft-1", "lr": 0.0001, "pt": False,
                                                                  "cls": True}
    assert cfg["methods"]["nlft-1_lr1e-4_clsT"] == {"kind": "nlft", "k": 1, "lr": 0.0001, "reset_cls": True}
    assert "fc_lr1e-4" not in cfg["methods"]  # not searched


def test_a_base_off_the_grid_is_still_searched_and_trained():
    cfg = _config(enabled=True, methods=["taft-1"], taft={"pt": [False], "cls": [True]})
    cfg = validate_config(cfg, count_samples=False)
    assert [p["name"] for p in grid(cfg, "taft-1")] == ["taft-1_lr1e-3_ptF_clsT", "taft-1_lr1e-4_ptF_clsT"]
    assert "taft-1" in cfg["methods"]  # trained at its selected point: the other studies name it


def test_disabled_search_adds_nothing_and_validation_is_idempotent():
    plain = validate_config(_config(), count_samples=False)
    assert plain["search"]["variants"] == {} and set(plain["methods"]) == set(_config()["methods"])
    cfg = validate_config(_config(enabled=True), count_samples=False)
    again = validate_config(cfg, count_samples=False)
    assert again["methods"] == cfg["methods"] and again["search"]["variants"] == cfg["search"]["variants"]


def test_grid_points_stay_out_of_the_studies_that_default_to_every_method():
    from pipeline_src.plan.fusion import fusion_methods
    from pipeline_src.plan.privacy import privacy_methods

    cfg = _config(enabled=True)
    cfg["fusion"]["methods"] = []
    cfg["privacy"] = {"enabled": True, "public_train_size": 500}
    cfg = validate_config(cfg, count_samples=False)
    assert fusion_methods(cfg) == ["nlft-1", "last"]
    # the learning-rate points stay out; the DP search's own PT points join (the paper searched PT for DP):
    # each taft method's other PT (taft-1 linearizes at the pretrained weights, taft-1-vec resets)
    assert privacy_methods(cfg) == ["nlft-1", "taft-1", "taft-1-vec", "last", "taft-1_dp_ptF", "taft-1-vec_dp_ptT"]


@pytest.mark.parametrize("search, key", [
    ({"enabled": True, "methods": ["nope"]}, "search.methods[0]"),
    ({"enabled": True, "shards": [7]}, "search.shards[0]"),
])
def test_bad_search_keys_are_named(search, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        validate_config(_config(**search), count_samples=False)


def test_a_method_named_like_a_grid_point_is_refused():
    cfg = _config(enabled=True, methods=["nlft-1"])
    cfg["methods"]["nlft-1_lr1e-4_clsT"] = {"kind": "nlft", "k": 1, "lr": 0.5}
    with pytest.raises(ConfigError, match=r"methods\.nlft-1_lr1e-4_clsT.*grid point"):
        validate_config(cfg, count_samples=False)


def test_selection_reads_validation_files_of_every_candidate_only():
    cfg = validate_config(_config(enabled=True, methods=["taft-1"], shards=[2], taft={"pt": [False], "cls": [True]}),
                          count_samples=False)
    files = validation_targets(cfg, "R", "taft-1")
    assert files == ["R/validate/taft-1_lr1e-3_ptF_clsT/n2_s0/soup.parquet",
                     "R/validate/taft-1_lr1e-4_ptF_clsT/n2_s0/soup.parquet"]
    assert all("/validate/" in f for f in files)
    assert selection_targets(cfg, "R") == ["R/select/taft-1.parquet"]


def test_expand_search_names_the_searched_kinds():
    cfg = validate_config(_config(), count_samples=False)
    cfg["search"].update(enabled=True, methods=["fc"])
    expand_search(cfg)
    assert list(cfg["search"]["variants"]) == ["fc_lr1e-3", "fc_lr1e-4"]


def test_the_privacy_study_searches_pt_for_its_taft_methods():
    from pipeline_src.plan.privacy import privacy_jobs
    from pipeline_src.plan.private_search import private_selection_targets, private_validation_targets

    cfg = _config(enabled=True, methods=["fc"])
    cfg["privacy"] = {"enabled": True, "public_train_size": 500, "methods": ["nlft-1", "taft-1"], "regimes": ["fc"],
                      "epsilons": [8], "paper": {"methods": ["taft-1"], "regimes": ["fc"]}}
    cfg = validate_config(cfg, count_samples=False)
    assert cfg["methods"]["taft-1_dp_ptF"] == {**cfg["methods"]["taft-1"], "reset": True}
    assert cfg["search"]["variants"]["taft-1_dp_ptF"]["dp_only"] is True
    assert ("paper", "taft-1_dp_ptF", "fc") in privacy_jobs(cfg) and ("ours", "taft-1_dp_ptF", "fc") in privacy_jobs(cfg)
    assert private_selection_targets(cfg, "R") == ["R/select_private/ours/taft-1/fc/eps8.parquet",
                                                   "R/select_private/paper/taft-1/fc/eps8.parquet"]
    assert private_validation_targets(cfg, "R", "ours", "taft-1", "fc", "8") == [
        "R/validate_private/ours/taft-1/fc/eps8/n1_s0/shard0.parquet",
        "R/validate_private/ours/taft-1_dp_ptF/fc/eps8/n1_s0/shard0.parquet"]
    from pipeline_src.plan.search import method_shards
    assert method_shards(cfg, "taft-1_dp_ptF") == []  # only the privacy study trains it
    again = validate_config(cfg, count_samples=False)
    assert again["privacy"]["methods"] == cfg["privacy"]["methods"] and again["methods"] == cfg["methods"]
    # PT = T only (the method's own): no point, no selection
    cfg["search"]["privacy_pt"] = [True]
    assert "taft-1_dp_ptF" not in validate_config(cfg, count_samples=False)["methods"]


def test_a_method_trains_and_is_searched_at_its_own_shards_only():
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["methods"]["scratch"] = {"kind": "full", "init": "random", "shards": [1]}
    cfg["search"] = {"enabled": True, "methods": ["scratch", "fc"], "shards": [1, 2]}
    cfg = validate_config(cfg, count_samples=False)
    from pipeline_src.plan.search import method_shards

    assert method_shards(cfg, "scratch") == method_shards(cfg, "scratch_lr1e-4") == [1]
    assert method_shards(cfg, "fc_lr1e-4") == [1, 2] and method_shards(cfg, "fc") == cfg["shards"]
    assert {p.split("/")[-2] for p in validation_targets(cfg, "r", "scratch")} == {"n1_s0"}
    assert {p.split("/")[-2] for p in validation_targets(cfg, "r", "fc")} == {"n1_s0", "n2_s0"}


def test_a_methods_shards_are_some_of_the_studys():
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["methods"]["nlft-1"]["shards"] = [1, 7]
    with pytest.raises(ConfigError, match=r"'methods\.nlft-1\.shards': \[7\] not in the study's"):
        validate_config(cfg, count_samples=False)


@pytest.mark.parametrize("variants, given, why", [
    ({"fc_lr1e-2": {"base": "fc", "lr": 0.01}}, None, "no method of that name"),  # a point wanted by hand
    ({"fc_lr1e-2": {"base": "fc", "lr": 0.01}}, {"kind": "fc", "lr": 0.02}, "is not the point of 'fc'"),
    ({"fc_lr1e-2": {"base": "nope", "lr": 0.01}}, {"kind": "fc", "lr": 0.01}, "its base 'nope' is not a method"),
])
def test_search_variants_set_by_hand_are_refused_by_name(variants, given, why):
    """Issue 44, 5.7: `search.variants` set by hand was silently dropped (with a method of that
    name): it is validation's record of the grid points, so a config may carry it only as written."""
    cfg = _config(enabled=True, methods=["fc"])
    cfg["search"]["variants"] = variants
    if given:
        cfg["methods"]["fc_lr1e-2"] = given
    with pytest.raises(ConfigError, match=f"config key 'search.variants.fc_lr1e-2': .*{why}.*search.lrs"):
        validate_config(cfg, count_samples=False)
