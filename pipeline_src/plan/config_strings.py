"""Read the strings of nested `--config` values as the schema's types.

Snakemake parses a top-level `--config key=value` as an int, float or bool, but a nested value
(`--config shards=[1,3]`, `--config 'train={epochs: 3}'`) with YAML's base loader, which keeps
every scalar a string: `shards` would arrive as ['1', '3']. Before validation, a string where the
schema wants an integer, a number, a boolean or null (and not a string), or where its `enum` holds
the value's YAML reading, is replaced by that reading. Strings the schema allows stay strings,
and a string that reads as no allowed type stays as it is, for the validator to name.
"""
from __future__ import annotations

from typing import Any

import yaml

_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", type(None): "null"}


def _reading(value: str, schema: dict) -> Any:
    """The YAML reading of `value` when the schema takes it (and no string), else `value` itself."""
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if "string" in types or not (types or "enum" in schema):
        return value
    try:
        read = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if isinstance(read, str):  # YAML 1.1 reads "1e-3" (no dot) as a string; Python as a float
        try:
            read = float(value) if {"number", "integer"} & set(types) else read
        except ValueError:
            pass
    json_type = _JSON_TYPES.get(type(read))
    if json_type is None:  # a list or mapping written as a string: not ours to read
        return value
    if types and not (json_type in types or (json_type == "integer" and "number" in types)):
        return value
    if "enum" in schema and not any(read == e and type(read) is type(e) for e in schema["enum"]):
        return value
    return read


def coerce_strings(value: Any, schema: dict) -> Any:
    """`value` with the strings read as the schema's types, recursively (a new object where changed).

    Args:
        value: a config or a part of it.
        schema: the JSON schema of `value` (properties, additionalProperties, items are followed).
    """
    if isinstance(value, str):
        return _reading(value, schema)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            out[key] = coerce_strings(item, sub) if sub else item
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce_strings(item, schema["items"]) for item in value]
    return value
