"""The parse-time cache (`plan/cache.py`): values are reused for an identical key only, and a
dry run's validation with a warm cache imports neither scikit-learn nor Opacus."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_src.plan.cache import cached
from tests.conftest import REPO


def test_cached_reuses_only_an_identical_key(tmp_path: Path):
    calls = []

    def compute(v):
        return lambda: calls.append(v) or v

    assert cached(tmp_path, "x", {"a": 1}, compute(10)) == 10
    assert cached(tmp_path, "x", {"a": 1}, compute(99)) == 10  # stored
    assert cached(tmp_path, "x", {"a": 2}, compute(20)) == 20  # another key
    assert cached(None, "x", {"a": 1}, compute(30)) == 30      # no cache folder: always computed
    assert calls == [10, 20, 30]
    for f in tmp_path.glob("x-*.json"):
        f.write_text("{not json")
    assert cached(tmp_path, "x", {"a": 1}, compute(11)) == 11  # unreadable entry: recomputed
    assert cached(tmp_path, "x", {"a": 1}, compute(12)) == 11  # and stored again
    assert calls == [10, 20, 30, 11]


def test_a_failed_check_is_not_cached(tmp_path: Path):
    def bad():
        raise ValueError("infeasible")

    for _ in range(2):
        with pytest.raises(ValueError, match="infeasible"):
            cached(tmp_path, "x", {"a": 1}, bad)
    assert list(tmp_path.iterdir()) == []


VALIDATE = """
import sys, yaml
from pipeline_src.plan.config import validate_config
cfg = validate_config(yaml.safe_load(open(sys.argv[1])), cache_dir=sys.argv[2])
print(sorted(m for m in ("sklearn", "opacus", "torch") if m in sys.modules))
"""


def test_warm_cache_validates_the_default_study_without_sklearn_or_opacus(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run():
        out = subprocess.run([sys.executable, "-c", VALIDATE, str(REPO / "config.yaml"), str(tmp_path)],
                             capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
        return eval(out.stdout.strip().splitlines()[-1])

    cold = set(run())  # cold: checks the budgets (torch-free accountant; the digits labels without sklearn)
    assert not {"opacus", "sklearn", "torch"} & cold
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.json")) == ["privacy_budgets", "train_count"]
    assert run() == []


def test_cached_count_equals_a_fresh_one(tmp_path: Path):
    import yaml

    from pipeline_src.plan.config import validate_config
    from pipeline_src.plan.samples import count_train_samples

    raw = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    for fraction in (0.3, 0.5):
        raw["dataset"]["test_fraction"] = fraction
        for _ in range(2):  # cold, then warm
            cfg = validate_config(raw, cache_dir=tmp_path)
        entries = [json.loads(p.read_text()) for p in tmp_path.glob("train_count-*.json")]
        assert count_train_samples(cfg) in [e["value"] for e in entries if e["key"]["dataset"]["test_fraction"] == fraction]
    assert len(list(tmp_path.glob("train_count-*.json"))) == 2
