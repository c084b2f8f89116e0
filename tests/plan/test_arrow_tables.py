"""Arrow arrays from buffers (plan/arrow_tables.py): equal to pyarrow's own conversion, and no pandas."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipeline_src.plan.arrow_tables import bool_array, int64_array, string_array, string_scalar, table_from_columns
from pipeline_src.plan.samples import SAMPLES_SCHEMA

REPO = Path(__file__).resolve().parents[2]

STRINGS = [
    [],
    [""],
    ["digits/3/0007", "", "fashion/Ankle boot/60000", "ü/β/中文", "a" * 1000],
    [f"idx/{i % 7}/{i:05d}" for i in range(70_000)],
]


@pytest.mark.parametrize("values", STRINGS, ids=["empty", "one empty string", "unicode and long", "70,000 ids"])
def test_string_array_equals_pa_array(values):
    got = string_array(values)
    assert got.validate(full=True) is None
    assert got.equals(pa.array(values, pa.string()))
    assert got.to_pylist() == values


@pytest.mark.parametrize("values", [[], [0], [-(2**63), 2**63 - 1, 3], list(range(-50, 50))])
def test_int64_array_equals_pa_array(values):
    for given in (values, np.array(values, dtype=np.int64)):
        got = int64_array(given)
        assert got.validate(full=True) is None
        assert got.equals(pa.array(values, pa.int64()))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 17, 1000])
def test_bool_array_equals_pa_array_across_byte_boundaries(n):
    values = [bool(x) for x in np.random.default_rng(n).integers(0, 2, n)]
    got = bool_array(values)
    assert got.validate(full=True) is None
    assert got.equals(pa.array(values, pa.bool_()))


def test_table_from_columns_equals_from_pydict():
    cols = {"sample_id": ["b", "a", "ü"], "row": [0, 1, 2], "task": ["target", "source", "target"],
            "split": ["train", "val", "test"], "label": [1, 0, 4], "class_name": ["3", "0", "9"]}
    got = table_from_columns(cols, SAMPLES_SCHEMA)
    assert got.schema == SAMPLES_SCHEMA
    assert got.equals(pa.Table.from_pydict(cols, schema=SAMPLES_SCHEMA))
    with pytest.raises(TypeError, match="'x' has type double"):
        table_from_columns({"x": [1.0]}, pa.schema([("x", pa.float64())]))


def test_string_scalar_compares_like_a_python_string():
    col = string_array(["train", "val", "train"])
    assert pc.equal(col, string_scalar("train")).to_pylist() == [True, False, True]


# Everything the DAG build does with the samples table and shard manifests, in a fresh interpreter.
PLAN_WITHOUT_PANDAS = """
import sys, yaml
from pipeline_src.plan.config import validate_config
from pipeline_src.plan.forget import (forgotten_by_shard, remove_ids, samples_table, shard_members, train_count,
                                      train_ids, validate_request)
from pipeline_src.plan.sharding import shard_ids, shard_manifest, shard_sizes
cfg = validate_config(yaml.safe_load(open(sys.argv[1])), cache_dir=sys.argv[2])
table = samples_table(cfg)
ids = train_ids(table)
manifest = shard_manifest(ids, 4, 0)
assert sum(shard_sizes(manifest, 4)) == train_count(table) == len(ids)
request = validate_request(ids[:3], table)
assert forgotten_by_shard(manifest, request) and shard_ids(manifest, 1) and shard_members(cfg, 4, 0, 2)
assert remove_ids(manifest, request).num_rows == len(ids) - 3
print("pandas" in sys.modules)
"""


def test_planning_the_default_study_imports_no_pandas(tmp_path):
    """pyarrow imports pandas on its first conversion of Python values: 0.25 CPU-s of a dry run (issue 44)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_PANDAS, str(REPO / "config.yaml"), str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr
