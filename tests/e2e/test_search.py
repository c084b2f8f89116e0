"""The validation search in the tiny `.test` study (its `search:` subset of the paper's grid):
validate, select, the report of the choices, and what a change reruns."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import planned_outputs, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def study(tiny_study) -> Path:
    return tiny_study


def _choices(results: Path, method: str) -> list[dict]:
    return json.loads((results / "select" / f"{method}.json").read_text())["choices"]


def test_each_searched_method_has_a_choice_per_n_from_validation_rows(study):
    results = study / "results"
    cfg = yaml.safe_load((study / "config.yaml").read_text())
    for method in cfg["search"]["methods"]:
        rows = pq.read_table(results / "select" / f"{method}.parquet").to_pylist()
        assert sorted({r["shards"] for r in rows}) == sorted(cfg["shards"])
        assert [sum(r["selected"] for r in rows if r["shards"] == n) for n in cfg["shards"]] == [1] * len(cfg["shards"])
        for r in rows:  # each candidate's figure is its validation file's accuracy
            model = "shard" if r["shards"] == 1 else "soup"
            val = pq.read_table(results / "validate" / r["candidate"] / f"n{r['shards']}_s0" / f"{model}.parquet")
            assert set(val.column("split").to_pylist()) == {"val"}
            acc = [v for m, v in zip(val.column("metric").to_pylist(), val.column("value").to_pylist()) if m == "accuracy"]
            assert r["val_accuracy"] == pytest.approx(acc[0])
    # taft-1's own point (PT = T) is off this grid: never a candidate
    assert all(r["candidate"] != "taft-1" for r in pq.read_table(results / "select" / "taft-1.parquet").to_pylist())


def test_report_shows_the_choice_and_the_selected_points_test_accuracy_in_the_tables(study):
    report = study / "results" / "report"
    table = (report / "search_selection.md").read_text()
    chosen = _choices(study / "results", "taft-1")[0]
    assert chosen["shards"] == 1 and chosen["candidate"] in table
    test = pq.read_table(study / "results" / "metrics" / "evaluate" / chosen["candidate"] / "n1_s0" / "shards.parquet")  # N = 1: shard 0 only
    acc = dict(zip(test.column("metric").to_pylist(), test.column("value").to_pylist()))["accuracy"]
    table1 = (report / "table1_methods.csv").read_text()
    assert f"taft-1,{acc}" in table1.replace(" ", "")  # Table 1's taft-1 is the selected point
    assert not re.search(r"taft-1_lr", table1)  # no other point's test accuracy


def test_changing_one_grid_point_reruns_only_its_jobs_and_the_selection(study, tmp_path):
    cfg = yaml.safe_load((study / "config.yaml").read_text())
    cfg["search"]["lrs"] = [0.001, 0.0003]  # 1e-4 -> 3e-4
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(study, "-n", "--cores", "2", "--configfile", str(tmp_path / "changed.yaml"))
    outputs = planned_outputs(proc)
    assert any("fc_lr3e-4" in o for o in outputs) and any("taft-1_lr3e-4_ptF_clsT" in o for o in outputs)
    others = [o for o in outputs if "_lr3e-4" not in o and "signatures/" not in o]
    assert sorted(others) == sorted(["results/select/fc.parquet, results/select/fc.json",
                                     "results/select/taft-1.parquet, results/select/taft-1.json", "results/report"])


def test_rewritten_test_rows_change_no_choice(study, tmp_path):
    work = copy_study(study, tmp_path / "work", parts=None)
    (work / "config.yaml").write_text((study / "config.yaml").read_text())
    before = {m: _choices(work / "results", m) for m in ("fc", "taft-1")}
    for path in (work / "results" / "metrics" / "evaluate").rglob("*.parquet"):  # every test row turned around
        t = pq.read_table(path)
        values = [1.0 - v if m == "accuracy" else v for m, v in zip(t.column("metric").to_pylist(),
                                                                    t.column("value").to_pylist())]
        pq.write_table(t.set_column(t.schema.get_field_index("value"), "value", [values]), path)
    proc = snakemake(work, "-n", "--cores", "2", "search")
    assert "Nothing to be done" in proc.stdout + proc.stderr  # select reads no test file
    snakemake(work, "--cores", "2", "search", "--forcerun", "select")
    assert {m: _choices(work / "results", m) for m in ("fc", "taft-1")} == before
