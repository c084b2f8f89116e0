"""The study's memo of the σ search (`plan/rdp_memo.py`) and the faster accountant's ε in a DP job
(`dp.budget`): a σ read back is the searched one bit for bit and is not searched again; a changed
setting is searched afresh; a σ that misses its target is refused, wherever it came from; the ε spent
from the faster accountant agrees with Opacus' own."""
from __future__ import annotations

import json

import pytest
from opacus.accountants import RDPAccountant

from pipeline_src.dp import budget
from pipeline_src.dp.budget import plan_budget, spent_epsilon
from pipeline_src.plan import rdp_accountant
from pipeline_src.plan.rdp_memo import StudyRdp

SETTING = dict(epsilon=3.0, delta=1e-5, public_size=500, batch_size=64, epochs=10, max_grad_norm=1.0)


@pytest.fixture(autouse=True)
def no_process_cache():
    budget._noise_multiplier.cache_clear()  # the per-process memo would hide the disk's
    yield
    budget._noise_multiplier.cache_clear()


def test_a_memoized_sigma_is_the_searched_one_and_is_not_searched_again(tmp_path, monkeypatch):
    first = plan_budget(**SETTING, rdp=StudyRdp(tmp_path))
    assert first == plan_budget(**SETTING, rdp=rdp_accountant) | {"epsilon_planned": first["epsilon_planned"]}
    assert len(list(tmp_path.glob("noise_multiplier-*.json"))) == 1
    budget._noise_multiplier.cache_clear()

    def no_search(**_):
        raise AssertionError("searched again")
    monkeypatch.setattr(rdp_accountant, "noise_multiplier", no_search)
    again = plan_budget(**SETTING, rdp=StudyRdp(tmp_path))  # another job of the study
    assert again == first
    with pytest.raises(AssertionError, match="searched again"):  # another setting is a new entry
        plan_budget(**{**SETTING, "epsilon": 8.0}, rdp=StudyRdp(tmp_path))


def test_a_sigma_that_misses_its_target_is_refused(tmp_path):
    good = plan_budget(**SETTING, rdp=StudyRdp(tmp_path))
    entry = next(tmp_path.glob("noise_multiplier-*.json"))
    stored = json.loads(entry.read_text())
    stored["value"] = good["sigma"] / 2  # an entry edited by hand: half the noise
    entry.write_text(json.dumps(stored))
    budget._noise_multiplier.cache_clear()
    with pytest.raises(RuntimeError, match=r"spends ε .* > the target 3\.0"):
        plan_budget(**SETTING, rdp=StudyRdp(tmp_path))


def test_no_cache_folder_memoizes_nothing(tmp_path):
    assert plan_budget(**SETTING, rdp=StudyRdp(None))["sigma"] == plan_budget(**SETTING)["sigma"]


@pytest.mark.parametrize("sigma, q, steps", [(1.06, 0.125, 80), (4.77, 0.125, 80), (0.9, 0.02, 1000)])
def test_the_spent_epsilon_of_one_run_of_steps_is_opacus_own(sigma, q, steps):
    acc = RDPAccountant()
    for _ in range(steps):
        acc.step(noise_multiplier=sigma, sample_rate=q)
    assert acc.history == [(sigma, q, steps)]
    assert spent_epsilon(acc, 1e-5, rdp_accountant) == pytest.approx(acc.get_epsilon(delta=1e-5), rel=1e-9)


def test_a_history_of_several_settings_is_left_to_opacus():
    acc = RDPAccountant()
    acc.step(noise_multiplier=1.0, sample_rate=0.1)
    acc.step(noise_multiplier=2.0, sample_rate=0.1)

    class Refuses:
        def epsilon(self, **_):
            raise AssertionError("a composed history must not reach the one-setting formula")
    assert spent_epsilon(acc, 1e-5, Refuses()) == acc.get_epsilon(delta=1e-5)
