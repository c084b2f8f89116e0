"""The `select` step reads validation rows only, and its choice ignores the test split."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_src.runner.step_args import Paths, StepArgs
from pipeline_src.steps import select
from pipeline_src.store.metrics import METRICS_SCHEMA

CANDIDATES = [{"name": "taft-1", "lr": 1e-3, "pt": True, "cls": False},
              {"name": "taft-1_lr1e-4_ptF_clsT", "lr": 1e-4, "pt": False, "cls": True}]


def _write(path, method, shards, model, split, values_by_seed):
    rows = [{"method": method, "model": model, "shards": shards, "seed": s, "split": split, "metric": "accuracy",
             "value": v, "kind": "taft", "experiment": "x"} for s, v in values_by_seed.items()]
    rows += [{**r, "metric": "loss", "value": 9.0} for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=METRICS_SCHEMA), path)
    return str(path)


def _study(tmp_path, test_values):
    """Validation files (the second point better on val) and test files (as given) of two candidates."""
    val = {"taft-1": {0: 0.80, 1: 0.84}, "taft-1_lr1e-4_ptF_clsT": {0: 0.85, 1: 0.83}}
    files = []
    for name in val:
        files.append(_write(tmp_path / "validate" / name / "n1.parquet", name, 1, "shard", "val", val[name]))
        _write(tmp_path / "metrics" / "evaluate" / name / "n1.parquet", name, 1, "shard", "test", test_values[name])
    return files


def _select(tmp_path, files):
    out = tmp_path / "select"
    out.mkdir(exist_ok=True)
    args = StepArgs(input=Paths(files, {"validation": files}),
                    output=Paths([], {"choice": str(out / "taft-1.parquet"), "record": str(out / "taft-1.json")}),
                    params={"candidates": CANDIDATES, "settings": {"experiment": "x"}},
                    wildcards={"method": "taft-1"}, rule="select")
    select.main(args)
    return json.loads((out / "taft-1.json").read_text())["choices"], pq.read_table(out / "taft-1.parquet").to_pylist()


def test_selects_the_best_mean_validation_accuracy_whatever_the_test_rows_say(tmp_path):
    files = _study(tmp_path, {"taft-1": {0: 0.99, 1: 0.99}, "taft-1_lr1e-4_ptF_clsT": {0: 0.10, 1: 0.10}})
    choices, rows = _select(tmp_path, files)
    assert [c["candidate"] for c in choices] == ["taft-1_lr1e-4_ptF_clsT"]  # val means 0.84 vs 0.82
    assert choices[0]["val_accuracy"] == pytest.approx(0.84)
    assert {r["candidate"]: r["seeds"] for r in rows} == {"taft-1": 2, "taft-1_lr1e-4_ptF_clsT": 2}
    # the test split rewritten after selection (now the other way round): the same choice
    _study(tmp_path, {"taft-1": {0: 0.10, 1: 0.10}, "taft-1_lr1e-4_ptF_clsT": {0: 0.99, 1: 0.99}})
    assert _select(tmp_path, files)[0] == choices


def test_a_test_row_among_the_inputs_is_refused_by_file(tmp_path):
    files = _study(tmp_path, {"taft-1": {0: 0.5}, "taft-1_lr1e-4_ptF_clsT": {0: 0.5}})
    test_file = str(tmp_path / "metrics" / "evaluate" / "taft-1" / "n1.parquet")
    with pytest.raises(ValueError, match=r"n1\.parquet holds a row of split 'test'"):
        _select(tmp_path, [*files, test_file])


def test_ties_go_to_the_first_point_in_grid_order_and_a_missing_point_is_named():
    rows = [{"method": c["name"], "shards": 1, "model": "shard", "value": 0.5} for c in CANDIDATES]
    out = select.choose(rows, CANDIDATES, "taft-1", "x")
    assert [r["candidate"] for r in out if r["selected"]] == ["taft-1"]
    with pytest.raises(ValueError, match="no validation rows of taft-1_lr1e-4_ptF_clsT at N = 1"):
        select.choose(rows[:1], CANDIDATES, "taft-1", "x")
