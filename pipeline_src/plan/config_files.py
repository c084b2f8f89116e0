"""The config files themselves, before their values: a key given twice in one mapping is refused.

Snakemake reads a configfile with its own YAML loader, where the last of two equal keys wins
silently (a whole study once reran on "Params have changed" for it). The Snakefile reads each
file Snakemake loaded (`workflow.configfiles`: `config.yaml`, or the `--configfile` files such as
`studies/*.yaml`) again here, as a node tree, and names the first duplicate with its file and line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import yaml

from pipeline_src.plan.errors import ConfigError


def _duplicates(node: yaml.Node, path: str) -> Iterable[tuple[str, int, int]]:
    """(dotted key, line of its first use, line of the repeat) for every repeated key under node."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else None
            if name is not None and key.tag != "tag:yaml.org,2002:merge":
                dotted = f"{path}.{name}" if path else name
                if name in seen:
                    yield dotted, seen[name], key.start_mark.line + 1
                else:
                    seen[name] = key.start_mark.line + 1
                yield from _duplicates(value, dotted)
            else:
                yield from _duplicates(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicates(item, f"{path}[{i}]")


def check_duplicate_keys(paths: Iterable[str | Path]) -> None:
    """Refuse a config file that gives one key twice in the same mapping.

    Args:
        paths: the YAML (or JSON) config files; a missing file is Snakemake's to report.
    Raises:
        ConfigError: naming the dotted key, the file and both lines.
    """
    for p in paths:
        p = Path(p)
        if not p.is_file():
            continue
        try:
            # libyaml's composer where PyYAML has it: 10 ms less of every parse for a study file
            root = yaml.compose(p.read_text(encoding="utf-8-sig"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError:
            continue  # Snakemake has read it already; a syntax error is its message, not ours
        for dotted, first, again in _duplicates(root, "") if root is not None else ():
            raise ConfigError(f"config key '{dotted}' is given twice in {p} (lines {first} and {again}); "
                              "the last would win silently: keep one")
