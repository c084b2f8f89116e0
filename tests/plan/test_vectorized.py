"""Which shards train in one vectorized job (plan/vectorized.py): `auto`'s rule, forget requests,
and the per-shard rule's constraint that keeps it off the vectorized jobs' files."""
from __future__ import annotations

import re

import pytest

from pipeline_src.plan.config import validate_config
from pipeline_src.plan.forget import shard_members
from pipeline_src.plan.vectorized import (
    auto_pays,
    is_vectorized,
    train_method_constraint,
    vectorized_jobs,
    vectorized_shards,
)


def _cfg(shards: list[int], methods: dict, **extra) -> dict:
    # digits: 527 target training samples, so N = 4 gives ~132 a shard, N = 2 ~264
    return validate_config({"experiment": "x", "dataset": {"source": "digits", "source_classes": [0, 1, 2, 3, 4]},
                            "methods": methods, "shards": shards, "seeds": [0], **extra})


@pytest.mark.parametrize("n, size, pays", [(1, 50, False), (2, 200, True), (2, 264, False), (4, 400, False),
                                           (10, 400, True), (10, 401, False), (50, 80, True)])
def test_auto_pays_where_measured(n, size, pays):
    assert auto_pays(n, size) is pays


@pytest.mark.parametrize("n, size, k, tangent, pays", [(4, 132, 4, True, False), (10, 53, 4, True, True),
                                                       (10, 53, 2, False, False), (4, 132, 1, False, True),
                                                       (1, 53, 4, True, False)])
def test_deeper_tuned_parts_stack_only_as_taft_on_small_shards(n, size, k, tangent, pays):
    assert auto_pays(n, size, k, tangent) is pays


def test_auto_by_kind_and_shard_size_explicit_choices_win():
    cfg = _cfg([1, 2, 4], {"fc": {"kind": "fc"}, "last": {"kind": "last", "rank": 4, "heads": 2},
                           "nlft-off": {"kind": "nlft", "k": 1, "vectorized_shards": False},
                           "taft": {"kind": "taft", "k": 1}, "taft-on": {"kind": "taft", "k": 1, "vectorized_shards": True},
                           "full": {"kind": "full"}, "nlft-4": {"kind": "nlft", "k": 4},
                           "taft-4": {"kind": "taft", "k": 4}})
    on = {(m, n) for m in cfg["methods"] for n in cfg["shards"] if is_vectorized(cfg, m, n)}
    # auto: N = 4 (~132 a shard) pays, N = 2 (~264) does not, N = 1 never; full has no vectorized path;
    # a 4-block tuned part not at ~132 a shard
    assert on == {("fc", 4), ("last", 4), ("taft", 4), ("taft-on", 1), ("taft-on", 2), ("taft-on", 4)}
    assert {(m, n) for m, n, _, _ in vectorized_jobs(cfg)} == on


def test_a_forget_request_moves_only_its_shards_out_of_the_vectorized_job(tmp_path):
    methods = {"fc": {"kind": "fc"}}
    cfg = _cfg([4], methods)
    assert vectorized_shards(cfg, "fc", 4, 0) == [0, 1, 2, 3]
    forgotten = shard_members(cfg, 4, 0, 2)[:2]
    (tmp_path / "forget.txt").write_text("\n".join(forgotten) + "\n")
    asked = _cfg([4], methods, forget={"requests": str(tmp_path / "forget.txt")})
    assert is_vectorized(asked, "fc", 4)  # the choice is made on the split before the request
    assert vectorized_shards(asked, "fc", 4, 0) == [0, 1, 3]


def test_the_per_shard_rule_is_kept_off_exactly_the_vectorized_files():
    constraint = train_method_constraint(["fc", "nlft-1"], [("fc", 4, 0, [0, 1, 3])])
    pattern = re.compile(rf"results/train/(?P<method>{constraint})/n(?P<shards>\d+)_s(?P<seed>\d+)/shard(?P<shard>\d+)"
                         r"\.(safetensors|json)$")
    claimed = {f"fc/n4_s0/shard{i}.{ext}" for i in (2, 10, 11) for ext in ("safetensors", "json")}
    claimed |= {"fc/n4_s1/shard0.json", "fc/n40_s0/shard0.json", "nlft-1/n4_s0/shard0.safetensors"}
    for path in claimed:
        assert pattern.match(f"results/train/{path}"), path
    for i in (0, 1, 3):
        assert not pattern.match(f"results/train/fc/n4_s0/shard{i}.safetensors")
        assert not pattern.match(f"results/train/fc/n4_s0/shard{i}.json")
    assert train_method_constraint(["fc"], []) == "(?:fc)"

