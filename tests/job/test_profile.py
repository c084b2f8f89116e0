"""job/profile.py: PIPELINE_PROFILE_DIR profiles a job's step (CPU clock) into <dir>/<rule>/<job>.prof;
unset, it does nothing."""
from __future__ import annotations

import pstats

from pipeline_src.job.profile import PROFILE_DIR_ENV, profile_path, profiled


def _work() -> int:
    return sum(i * i for i in range(20000))


def test_a_job_log_names_its_profile(tmp_path):
    log = "results/x/logs/train_private/ours/nlft-1/fc/eps8/n1_s0/shard0.log"
    assert profile_path(tmp_path, "train_private", log) == \
        tmp_path / "train_private" / "ours__nlft-1__fc__eps8__n1_s0__shard0.prof"
    assert profile_path(tmp_path, "report", "elsewhere/report.log") == tmp_path / "report" / "report.prof"


def test_set_it_writes_a_readable_profile_of_the_block(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path / "prof"))
    with profiled("compose", "results/x/logs/compose/fc/n2_s0/soup.log"):
        _work()
    out = tmp_path / "prof" / "compose" / "fc__n2_s0__soup.prof"
    stats = pstats.Stats(str(out))
    assert any(name == "_work" for (_, _, name) in stats.stats)


def test_unset_it_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(PROFILE_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with profiled("compose", "results/x/logs/compose/fc/n2_s0/soup.log"):
        _work()
    assert list(tmp_path.rglob("*.prof")) == []


def test_a_log_named_like_its_rule(tmp_path):
    assert profile_path(tmp_path, "report", "results/x/logs/report/report.log") == tmp_path / "report" / "report.prof"
    assert profile_path(tmp_path, "release", "results/x/logs/release/release.log") == \
        tmp_path / "release" / "release.prof"
