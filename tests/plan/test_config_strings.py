"""Nested `--config` values arrive as strings; they are read as the schema's types (issue 24, item 7)."""
from __future__ import annotations

import yaml

from pipeline_src.plan.config import load_schema, validate_config
from pipeline_src.plan.config_strings import coerce_strings
from tests.conftest import REPO


def base_load(text: str):
    """What Snakemake's --config gives a nested value: YAML's base loader, every scalar a string."""
    return yaml.load(text, Loader=yaml.loader.BaseLoader)


def test_strings_are_read_where_the_schema_wants_numbers_booleans_or_null():
    schema = load_schema()
    given = {"shards": base_load("[1,3]"), "seeds": base_load("[0]"), "experiment": "123",
             "train": base_load("{epochs: 3, lr: 1e-3, batch_size: '7', augment: {enabled: false}}"),
             "dataset": base_load("{in_chans: 3, path: null, source_classes: [0, 1], source: digits}"),
             "methods": base_load("{t: {kind: taft, k: 1, reset: true, radius: null, l2: 0}}"),
             "forget": base_load("{study: {methods: [1], shards: [3]}}")}
    got = coerce_strings(given, schema)
    assert got["shards"] == [1, 3] and got["seeds"] == [0]
    assert got["experiment"] == "123"  # the schema wants a string: kept
    assert got["train"] == {"epochs": 3, "lr": 1e-3, "batch_size": 7, "augment": {"enabled": False}}
    # source_classes take names or labels: a string stays a name (digits' classes are named "0".."9")
    assert got["dataset"] == {"in_chans": 3, "path": "null", "source_classes": ["0", "1"], "source": "digits"}
    assert got["methods"]["t"] == {"kind": "taft", "k": 1, "reset": True, "radius": None, "l2": 0}
    assert got["forget"]["study"] == {"methods": ["1"], "shards": [3]}  # method names are strings
    assert given["shards"] == ["1", "3"]  # the input is not changed


def test_a_string_that_reads_as_no_allowed_type_is_left_for_the_validator():
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["shards"] = ["1", "three"]
    try:
        validate_config(cfg, count_samples=False)
    except Exception as e:  # noqa: BLE001 (the message is what is tested)
        assert "config key 'shards.1'" in str(e) and "'three' is not of type 'integer'" in str(e)
    else:
        raise AssertionError("'three' passed as a shard count")
    cfg["shards"] = ["1", "3"]
    assert validate_config(cfg, count_samples=False)["shards"] == [1, 3]
