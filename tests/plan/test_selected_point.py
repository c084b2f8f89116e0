"""A searched method trains at its selected point (`plan/selected_point.py`): which choice a job
takes, and the job side that reads the `select` record and moves the method's settings there
(`runner/step_args.selected_params`)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from pipeline_src.plan.config import validate_config
from pipeline_src.plan.selected_point import (
    PRIVATE_AXES,
    choice_shards,
    chosen_point,
    selected_at,
    selection_base,
    selection_shards,
)
from pipeline_src.plan.step_settings import settings_for
from pipeline_src.runner.step_args import Paths, from_snakemake, selected_params
from tests.conftest import REPO


def _study(**changes) -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg.update(changes)
    return validate_config(cfg, count_samples=False)


def test_unsearched_n_take_the_nearest_searched_choice_on_a_log_scale():
    cfg = _study(shards=[1, 2, 10, 25, 50], search={"enabled": True, "methods": ["fc"], "shards": [1, 10]})
    assert selection_shards(cfg, "fc") == [1, 10]
    assert [choice_shards(cfg, "fc", n) for n in (1, 2, 10, 25, 50)] == [1, 1, 10, 10, 10]
    cfg = _study(shards=[1, 3, 9], search={"enabled": True, "methods": ["fc"], "shards": [1, 9]})
    assert choice_shards(cfg, "fc", 3) == 1  # log 3 is as far from log 1 as from log 9: the smaller


def test_which_jobs_train_at_a_selection():
    cfg = _study()  # the tiny study searches fc and taft-1
    assert selection_base(cfg, "fc") == "fc" and selection_base(cfg, "taft-1") == "taft-1"
    assert selection_base(cfg, "fc_lr1e-4") is None  # a grid point trains at its own settings
    assert selection_base(cfg, "nlft-1") is None  # not searched
    assert selected_at(cfg, "taft-1", 3) == {"method": "taft-1", "base": "taft-1", "shards": 2,
                                             "axes": ["lr", "pt", "cls"]}  # the forget study's N = 3
    assert selected_at(cfg, "nlft-1", 2) is None
    off = _study(search={"enabled": False})
    assert selected_at(off, "fc", 1) is None


def test_dp_jobs_take_cls_only_and_of_taft_only():
    cfg = _study(privacy={"enabled": True, "public_train_size": 500, "methods": ["nlft-1", "taft-1"],
                          "regimes": ["fc"], "epsilons": [8]},
                 search={"enabled": True, "methods": ["nlft-1", "taft-1"], "shards": [1, 2]})
    assert selected_at(cfg, "taft-1", 1, PRIVATE_AXES) == {"method": "taft-1", "base": "taft-1", "shards": 1,
                                                            "axes": ["cls"]}
    # the DP search's other PT takes the base's CLS; its non-private jobs do not exist
    assert selected_at(cfg, "taft-1_dp_ptF", 1, PRIVATE_AXES)["base"] == "taft-1"
    assert selected_at(cfg, "taft-1_dp_ptF", 1) is None
    assert selected_at(cfg, "nlft-1", 1, PRIVATE_AXES) is None  # a DP nlft model keeps its own settings


class _Named(list):
    """Snakemake's named list: a list of the paths that also has their names (`items`)."""

    def __init__(self, **named: str) -> None:
        super().__init__(named.values())
        self.named = named

    def items(self):
        return self.named.items()


def _record(tmp_path, method="taft-1", **choice):
    path = tmp_path / f"{method}.json"
    base = {"shards": 2, "model": "soup", "candidate": "taft-1_lr1e-4_ptF_clsT", "lr": 1e-4, "pt": False,
            "cls": True, "val_accuracy": 0.5}
    path.write_text(json.dumps({"method": method, "choices": [{**base, **choice}]}))
    return str(path)


def test_a_job_trains_and_records_the_point_of_its_selection_input(tmp_path):
    cfg = _study()
    spec = selected_at(cfg, "taft-1", 3)
    settings = settings_for("train", cfg, {"method": "taft-1"})
    assert settings["methods"]["taft-1"].get("reset", False) is False  # its own settings: PT = T
    path = _record(tmp_path)
    smk = SimpleNamespace(input=_Named(selection=path), output=_Named(), log=_Named(),
                          params={"settings": settings, "selected_at": spec}, wildcards={"method": "taft-1", "shards": "3"},
                          threads=1, resources={}, rule="train", config=cfg)
    args = from_snakemake(smk)
    method = args.job_config()["methods"]["taft-1"]
    assert (method["lr"], method["reset"], method["reset_cls"]) == (1e-4, True, True)
    assert method["selected"]["candidate"] == "taft-1_lr1e-4_ptF_clsT" and method["selected"]["chosen_at_shards"] == 2
    assert method["selected"]["file"] == path
    assert settings["methods"]["taft-1"].get("reset", False) is False  # the params themselves are not changed


def test_a_record_without_the_jobs_choice_or_of_another_method_is_refused(tmp_path):
    spec = {"method": "taft-1", "base": "taft-1", "shards": 10, "axes": ["lr"]}
    path = _record(tmp_path)
    params = {"settings": {"methods": {"taft-1": {"kind": "taft", "k": 1}}}, "selected_at": spec}
    with pytest.raises(ValueError, match=r"no choice at N = 10"):
        selected_params(params, Paths([path], {"selection": path}))
    other = _record(tmp_path, method="fc")
    with pytest.raises(ValueError, match=r"record of 'fc', not of 'taft-1'"):
        selected_params({**params, "selected_at": {**spec, "shards": 2}}, Paths([other], {"selection": other}))
    assert selected_params({"settings": {}}, Paths()) == {"settings": {}}  # no `selected_at`: as it is


def test_the_point_a_job_was_planned_at_is_its_rerun_trigger_and_checked_when_it_starts(tmp_path):
    """`chosen_point` (the `selected_at` param's point) holds what trains, not the validation
    accuracy; a job whose record chose another point after it was planned refuses by name."""
    path = _record(tmp_path)
    spec = {"method": "taft-1", "base": "taft-1", "shards": 2, "axes": ["lr", "pt", "cls"]}
    point = chosen_point(path, spec)
    assert point == {"candidate": "taft-1_lr1e-4_ptF_clsT", "lr": 1e-4, "pt": False, "cls": True}
    params = {"settings": {"methods": {"taft-1": {"kind": "taft", "k": 1}}}, "selected_at": {**spec, "point": point}}
    moved = selected_params(params, Paths([path], {"selection": path}))["settings"]["methods"]["taft-1"]
    assert (moved["lr"], moved["reset"], moved["reset_cls"]) == (1e-4, True, True)
    record = json.loads(open(path).read())
    for choice in record["choices"]:
        choice["val_accuracy"] = 0.123  # a retrained candidate at the same point: same trigger
    open(path, "w").write(json.dumps(record))
    assert chosen_point(path, spec) == point
    stale = {**params, "selected_at": {**spec, "point": {**point, "candidate": "taft-1_lr1e-3_ptF_clsT", "lr": 1e-3}}}
    with pytest.raises(ValueError, match=r"now chooses taft-1_lr1e-4_ptF_clsT at N = 2, but this job was planned at "
                                         r"taft-1_lr1e-3_ptF_clsT"):
        selected_params(stale, Paths([path], {"selection": path}))
