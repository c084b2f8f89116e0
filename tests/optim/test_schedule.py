"""`train.schedule` against torch.optim.lr_scheduler on the same steps: MultiStepLR stepped per
epoch (step), LinearLR warm-up then CosineAnnealingLR per step (cosine), and the config checks."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.optim.schedule import lr_factor, schedule_errors


def _torch_lrs(make, steps: int, step_every: int = 1, lr: float = 0.5) -> list[float]:
    """The lr torch's scheduler gives each optimizer step, stepping the scheduler every `step_every` steps."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make(opt)
    out = []
    for t in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        if (t + 1) % step_every == 0:
            sched.step()
    return out


@pytest.mark.parametrize("spe,epochs,milestones", [(7, 30, [15, 25]), (1, 10, [3]), (4, 6, [1, 2, 5])])
def test_step_schedule_equals_multistep_lr(spe, epochs, milestones):
    sched = {"name": "step", "milestones": milestones, "factor": 0.1}
    ref = _torch_lrs(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones, gamma=0.1), spe * epochs, spe)
    got = [0.5 * lr_factor(sched, t, spe, spe * epochs) for t in range(spe * epochs)]
    assert got == pytest.approx(ref, rel=1e-12)
    assert min(got) == pytest.approx(0.5 * 0.1 ** len(milestones))


@pytest.mark.parametrize("spe,epochs,warmup,min_factor", [(5, 8, 2, 0.0), (3, 10, 0, 0.1), (1, 12, 3, 0.05)])
def test_cosine_with_warmup_equals_linear_then_cosine_annealing(spe, epochs, warmup, min_factor):
    total, warm = spe * epochs, warmup * spe
    sched = {"name": "cosine", "warmup_epochs": warmup, "min_factor": min_factor}
    got = [0.5 * lr_factor(sched, t, spe, total) for t in range(total)]
    if warm:
        ref_warm = _torch_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1 / warm, end_factor=1.0,
                                                                          total_iters=warm - 1), warm)
        assert got[:warm] == pytest.approx(ref_warm, rel=1e-12)
    ref_cos = _torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=total - warm,
                                                                              eta_min=0.5 * min_factor), total - warm)
    assert got[warm:] == pytest.approx(ref_cos, rel=1e-9, abs=1e-12)


def test_constant_and_errors():
    assert {lr_factor({"name": "constant"}, t, 3, 30) for t in range(30)} == {1.0}
    assert schedule_errors({"name": "step", "milestones": [15, 25]}, 30) == []
    keys = lambda s, e: [k for k, _ in schedule_errors(s, e)]  # noqa: E731
    assert keys({"name": "step", "milestones": []}, 30) == ["train.schedule.milestones"]
    assert keys({"name": "step", "milestones": [25, 15]}, 30) == ["train.schedule.milestones"]
    assert keys({"name": "step", "milestones": [15, 30]}, 30) == ["train.schedule.milestones"]
    assert keys({"name": "cosine", "warmup_epochs": 5}, 5) == ["train.schedule.warmup_epochs"]
    with pytest.raises(ValueError, match="train.schedule.name"):
        lr_factor({"name": "poly"}, 0, 1, 1)


def test_config_validation_names_the_schedule_key():
    import copy

    import yaml

    from pipeline_src.plan.config import ConfigError, validate_config
    from tests.conftest import REPO

    tiny = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg = validate_config(copy.deepcopy(tiny), count_samples=False)
    assert cfg["train"]["schedule"]["name"] == "constant"  # the default: no schedule
    bad = copy.deepcopy(tiny)
    bad["train"]["schedule"] = {"name": "step", "milestones": [5]}  # the tiny study trains 2 epochs
    with pytest.raises(ConfigError, match=r"config key 'train.schedule.milestones'"):
        validate_config(bad, count_samples=False)
    bad = copy.deepcopy(tiny)
    bad["methods"]["fc"]["schedule"] = {"name": "cosine", "warmup_epochs": 2}
    with pytest.raises(ConfigError, match=r"config key 'methods.fc.schedule.warmup_epochs'"):
        validate_config(bad, count_samples=False)
    ok = copy.deepcopy(tiny)
    ok["methods"]["fc"].update(epochs=30, schedule={"name": "step", "milestones": [15, 25]})  # TAFT App. A
    assert validate_config(ok, count_samples=False)["methods"]["fc"]["schedule"]["factor"] == 0.1


def test_pretrain_schedule_is_optional_and_checked():
    from pipeline_src.plan.config import ConfigError, validate_config

    base = {"experiment": "x", "methods": {"fc": {"kind": "fc"}}, "shards": [1], "dataset": {"source_classes": [0]}}
    assert "schedule" not in validate_config(base, count_samples=False)["backbone"]["pretrain"]  # constant, as before
    cos = validate_config({**base, "backbone": {"pretrain": {"epochs": 10, "schedule": {"name": "cosine"}}}},
                          count_samples=False)
    assert cos["backbone"]["pretrain"]["schedule"]["min_factor"] == 0.0  # train.schedule's defaults filled in
    with pytest.raises(ConfigError, match=r"config key 'backbone.pretrain.schedule.milestones'"):
        validate_config({**base, "backbone": {"pretrain": {"epochs": 10, "schedule": {"name": "step",
                                                                                      "milestones": [12]}}}},
                        count_samples=False)
