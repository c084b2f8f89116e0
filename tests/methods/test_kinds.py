"""Per-kind facts (methods/kinds.py), the only place the pipeline branches on a method's kind."""
from __future__ import annotations

import ast

import pytest

from pipeline_src.methods.kinds import (
    KINDS,
    feature_cache,
    kind_of,
    kinds_where,
    matchable_blocks,
    matches_ffn,
    method_errors,
)
from tests.test_imports import _kind_comparisons


def test_facts():
    assert kinds_where("private") == ("nlft", "taft", "last")
    assert kinds_where("fusable") == ("nlft", "last")
    assert kinds_where("tangent") == ("taft",)
    assert kinds_where("side") == ("last",)
    assert set(KINDS) == {"fc", "nlft", "full", "taft", "last"}
    with pytest.raises(ValueError, match="unknown method kind 'lora'"):
        kind_of({"kind": "lora"})


def test_feature_cache():
    assert feature_cache({"kind": "full"}) is None
    assert feature_cache({"kind": "fc"}) == "last0"
    assert feature_cache({"kind": "nlft", "k": 2}) == "last2"
    assert feature_cache({"kind": "taft", "k": 1}) == "last1"
    assert feature_cache({"kind": "last", "rank": 4, "heads": 2}) == "blocks"


def test_method_errors_name_the_key():
    assert method_errors("a", {"kind": "nlft"}, 4) == [("methods.a.k", "required for kind 'nlft'")]
    assert method_errors("a", {"kind": "taft", "k": 5}, 4) == [("methods.a.k", "5 exceeds backbone depth 4")]
    assert method_errors("a", {"kind": "taft", "k": 5}, None) == []  # depth unknown at parse time
    assert method_errors("b", {"kind": "last", "rank": 4}, 4) == [("methods.b.heads", "required for kind 'last'")]
    assert method_errors("b", {"kind": "last", "rank": 6, "heads": 4}, 4) == [("methods.b.heads", "must divide rank 6")]
    assert method_errors("b", {"kind": "last", "rank": 4, "heads": 2, "every": 3}, 4)[0][0] == "methods.b.every"
    assert method_errors("c", {"kind": "fc"}, 4) == []


def test_fusion_facts():
    assert matchable_blocks({"kind": "nlft", "k": 2}, None) == 2
    assert matchable_blocks({"kind": "last", "rank": 4, "heads": 2, "every": 2}, 4) == 2
    assert matchable_blocks({"kind": "last", "rank": 4, "heads": 2}, None) is None
    assert matches_ffn("nlft") and not matches_ffn("last")


def test_the_kind_check_finds_branches():
    code = 'if cfg["kind"] == "taft": pass\nif ctx.kind in ("a",): pass\nif kind != "x": pass\nif other == 1: pass\n'
    assert _kind_comparisons(ast.parse(code)) == [1, 2, 3]
