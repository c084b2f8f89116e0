"""A key given twice in a config file is refused, naming the key and the file (issue 33, item 2)."""
from __future__ import annotations

import re

import pytest
import yaml

from pipeline_src.plan.config_files import check_duplicate_keys
from pipeline_src.plan.errors import ConfigError
from tests.conftest import REPO, snakemake


@pytest.mark.parametrize("text, key, lines", [
    ("seed: 0\nshards: [1]\nseed: 1\n", "seed", "lines 1 and 3"),
    ("train:\n  epochs: 2\n  lr: 0.1\n  epochs: 3\n", "train.epochs", "lines 2 and 4"),
    ("methods:\n  fc: {kind: fc, kind: nlft}\n", "methods.fc.kind", "lines 2 and 2"),
    ("fusion:\n  grid:\n    - {a: 1}\n    - {a: 1, a: 2}\n", "fusion.grid[1].a", "lines 4 and 4"),
])
def test_a_repeated_key_is_named_with_its_file(tmp_path, text, key, lines):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    assert yaml.safe_load(text) is not None  # PyYAML alone: the last value wins, silently
    with pytest.raises(ConfigError, match=re.escape(f"'{key}' is given twice in {path} ({lines})")):
        check_duplicate_keys([path])


def test_equal_keys_in_different_mappings_and_the_shipped_configs_pass(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("a: {x: 1}\nb: {x: 1}\nc: [{x: 1}, {x: 2}]\n")
    check_duplicate_keys([path, tmp_path / "missing.yaml", REPO / "config.yaml", REPO / ".test" / "config.yaml",
                          *sorted((REPO / "studies").glob("*.yaml"))])


@pytest.mark.parametrize("where", ["config.yaml", "--configfile"])
def test_snakemake_refuses_a_config_file_with_a_repeated_key(tmp_path, where):
    text = (REPO / ".test" / "config.yaml").read_text() + "seed: 1\n"  # the .test study gives seed: 0 first
    name = "config.yaml" if where == "config.yaml" else "my_study.yaml"
    (tmp_path / name).write_text(text)
    args = ("-n",) if where == "config.yaml" else ("-n", "--configfile", str(tmp_path / name))
    proc = snakemake(tmp_path, *args, check=False)
    assert proc.returncode != 0
    assert f"config key 'seed' is given twice in {name if where == 'config.yaml' else tmp_path / name}" in (
        proc.stdout + proc.stderr), proc.stderr[-2000:]
    assert not (tmp_path / "results").exists()
