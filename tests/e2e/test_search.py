"""The validation search in the tiny `.test` study (its `search:` subset of the paper's grid):
validate, select, the report of the choices, and what a change reruns."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def study(tiny_study) -> Path:
    return tiny_study


def _choices(results: Path, method: str) -> list[dict]:
    return json.loads((results / "select" / f"{method}.json").read_text())["choices"]


def test_each_searched_method_has_a_choice_per_n_from_validation_rows(study):
    results = results_of(study)
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
    report = results_of(study) / "report"
    table = (report / "search_selection.md").read_text()
    chosen = _choices(results_of(study), "taft-1")[0]
    assert chosen["shards"] == 1 and chosen["candidate"] in table
    # taft-1's own models train at the selected point; the grid points are validated only (never tested)
    test = pq.read_table(results_of(study) / "metrics" / "evaluate" / "taft-1" / "n1_s0" / "shards.parquet")  # N = 1: shard 0 only
    acc = dict(zip(test.column("metric").to_pylist(), test.column("value").to_pylist()))["accuracy"]
    table1 = (report / "table1_methods.csv").read_text()
    assert f"taft-1,{acc}" in table1.replace(" ", "")  # Table 1's taft-1 is the selected point
    assert not re.search(r"taft-1_lr", table1)  # no other point's test accuracy
    assert not (results_of(study) / "metrics" / "evaluate" / chosen["candidate"]).exists()
    points = (report / "trained_points.csv").read_text()
    assert f"taft-1,1,{chosen['candidate']},1," in points.replace(" ", "")


def _selected(record: Path) -> dict:
    return json.loads(record.read_text())["method_config"]["selected"]


def test_every_n_and_side_study_trains_at_the_selected_point_and_records_it(study):
    """Each searched method's jobs at every N, and the unlearning study's (N = 3, not searched: the
    nearest searched N's choice, N = 2), train at the choice they read and record it."""
    results = results_of(study)
    for method in ("fc", "taft-1"):
        choices = {c["shards"]: c for c in _choices(results, method)}
        for n in (1, 2):
            record = json.loads((results / "train" / method / f"n{n}_s0" / "shard0.json").read_text())
            chosen = choices[n]
            assert record["method_config"]["selected"]["candidate"] == chosen["candidate"]
            assert record["method_config"]["lr"] == chosen["lr"]
            if method == "taft-1":
                assert record["method_config"]["reset"] is (not chosen["pt"])
                assert record["method_config"]["reset_cls"] is chosen["cls"]
    retrained = sorted((results / "unlearn_retrain" / "taft-1" / "n3_s0").rglob("composed.json"))
    assert retrained
    for record in retrained:
        selected = _selected(record)
        assert selected["chosen_at_shards"] == 2
        assert selected["candidate"] == {c["shards"]: c for c in _choices(results, "taft-1")}[2]["candidate"]


def _dry_outputs(work: Path) -> list[str]:
    proc = snakemake(work, "-n", "--cores", "2")
    return sorted(o for o in planned_outputs(proc) if "signatures/" not in o)


FC_DEPENDANTS = sorted([  # fc trains at its selection at N = 1 and 2 (the tiny study's shards), nowhere else
    "results/tiny/train/fc/n1_s0/shard0.safetensors, results/tiny/train/fc/n1_s0/shard0.json",
    "results/tiny/train/fc/n2_s0/shard0.safetensors, results/tiny/train/fc/n2_s0/shard0.json",
    "results/tiny/train/fc/n2_s0/shard1.safetensors, results/tiny/train/fc/n2_s0/shard1.json",
    "results/tiny/compose/fc/n2_s0/soup.safetensors, results/tiny/compose/fc/n2_s0/soup.json",
    "results/tiny/metrics/evaluate/fc/n1_s0/shards.parquet, results/tiny/per_image/evaluate/fc/n1_s0/shards.parquet",
    "results/tiny/metrics/evaluate/fc/n2_s0/shards.parquet, results/tiny/per_image/evaluate/fc/n2_s0/shards.parquet",
    "results/tiny/metrics/evaluate/fc/n2_s0/soup.parquet, results/tiny/per_image/evaluate/fc/n2_s0/soup.parquet",
    "results/tiny/report"])


def _set_accuracy(path: Path, value: float) -> None:
    t = pq.read_table(path)
    values = [value if m == "accuracy" else v for m, v in zip(t.column("metric").to_pylist(), t.column("value").to_pylist())]
    pq.write_table(t.set_column(t.schema.get_field_index("value"), "value", pa.array(values, pa.float64())), path)


def test_a_changed_validation_result_reruns_exactly_the_dependants_of_a_changed_selection(study, tmp_path):
    """Real runs and dry runs. A validation result of one fc point changes: fc's selection reruns, and
    every job that trains at it (and what reads those) is planned. When the choice stays the same the
    point does too, and after `select` only the report (which lists every candidate's figure) is
    left; when the choice at one N changes, exactly fc's dependants at that N rerun. Nothing of taft-1, nlft-1 or the
    grid points reruns."""
    work = copy_study(study, tmp_path / "work", parts=None)
    (work / "config.yaml").write_text((study / "config.yaml").read_text())
    results = results_of(work)
    assert _dry_outputs(work) == []
    before = _choices(results, "fc")
    select = "results/tiny/select/fc.parquet, results/tiny/select/fc.json"
    _set_accuracy(results / "validate" / "fc_lr1e-4" / "n1_s0" / "shard.parquet", 0.01)  # still not chosen
    assert _dry_outputs(work) == sorted([select, *FC_DEPENDANTS])
    snakemake(work, "--cores", "2", "search")
    assert _choices(results, "fc") == before
    assert _dry_outputs(work) == ["results/tiny/report"]  # the same choice: nothing trains again
    _set_accuracy(results / "validate" / "fc_lr1e-4" / "n2_s0" / "soup.parquet", 0.99)  # now chosen at N = 2
    snakemake(work, "--cores", "2", "search")
    assert {c["shards"]: c["candidate"] for c in _choices(results, "fc")}[2] == "fc_lr1e-4"
    # `select` is a checkpoint and each job's trigger is its own choice: N = 1's stays, so only N = 2's rerun
    assert _dry_outputs(work) == [o for o in FC_DEPENDANTS if "/n1_s0/" not in o]


def test_changing_one_grid_point_reruns_only_its_jobs_the_selection_and_its_dependants(study, tmp_path):
    cfg = yaml.safe_load((study / "config.yaml").read_text())
    cfg["search"]["lrs"] = [0.001, 0.0003]  # 1e-4 -> 3e-4
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(study, "-n", "--cores", "2", "--configfile", str(tmp_path / "changed.yaml"))
    outputs = planned_outputs(proc)
    assert any("fc_lr3e-4" in o for o in outputs) and any("taft-1_lr3e-4_ptF_clsT" in o for o in outputs)
    others = sorted(o for o in outputs if "_lr3e-4" not in o and "signatures/" not in o)
    # what a rerun of both selections reruns: they, and the jobs that train at them (and their dependants)
    dependants = planned_outputs(snakemake(study, "-n", "--cores", "2", "--forcerun", "select"))
    assert others == sorted(o for o in dependants if "signatures/" not in o)
    assert "results/tiny/select/fc.parquet, results/tiny/select/fc.json" in others
    assert set(FC_DEPENDANTS) <= set(others)
    assert not [o for o in others if "nlft-1" in o and "paragon" not in o]  # nlft-1 trains at its own settings


def test_rewritten_test_rows_change_no_choice(study, tmp_path):
    work = copy_study(study, tmp_path / "work", parts=None)
    (work / "config.yaml").write_text((study / "config.yaml").read_text())
    before = {m: _choices(results_of(work), m) for m in ("fc", "taft-1")}
    for path in (results_of(work) / "metrics" / "evaluate").rglob("*.parquet"):  # every test row turned around
        t = pq.read_table(path)
        values = [1.0 - v if m == "accuracy" else v for m, v in zip(t.column("metric").to_pylist(),
                                                                    t.column("value").to_pylist())]
        pq.write_table(t.set_column(t.schema.get_field_index("value"), "value", [values]), path)
    proc = snakemake(work, "-n", "--cores", "2", "search")
    assert "Nothing to be done" in proc.stdout + proc.stderr  # select reads no test file
    snakemake(work, "--cores", "2", "search", "--forcerun", "select")
    assert {m: _choices(results_of(work), m) for m in ("fc", "taft-1")} == before
