"""Studies side by side without a workflow run: the layout's names, the old-layout message, moving
Snakemake's metadata records, the cross-study views (real DuckDB) and two report tables joined."""
from __future__ import annotations

import json
from base64 import urlsafe_b64encode
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_src.plan.studies import (
    list_studies,
    move_metadata,
    move_old_layout,
    old_layout_error,
    resolve_study,
    slurm_jobname_prefix,
    study_results,
)
from pipeline_src.store.studies_db import compare_tables, connect_studies


def test_a_study_folder_is_named_by_its_experiment():
    assert study_results("fashion-mnist") == "results/fashion-mnist"
    for bad in (None, "", "a/b", "benchmarks", "..", 3):
        assert study_results(bad) is None
    assert slurm_jobname_prefix("v1.2 study") == "v1-2-study"


def test_an_old_layout_is_named_with_the_command_that_moves_it(tmp_path):
    root = tmp_path / "results"
    (root / "tiny" / "prepare").mkdir(parents=True)
    (root / "tiny" / "prepare" / "samples.parquet").touch()  # a study of the new layout: fine
    assert old_layout_error(root, "tiny") is None
    (root / "prepare").mkdir()
    (root / "prepare" / "samples.parquet").touch()
    msg = old_layout_error(root, "tiny")
    assert "old layout" in msg and f"{root}/prepare/samples.parquet" in msg and "move-old-layout --study tiny" in msg
    with pytest.raises(SystemExit, match="old layout"):
        resolve_study("other", root=str(root))


def _record(meta: Path, target: str, body: dict, max_len: int = 255) -> Path:
    b64 = urlsafe_b64encode(target.encode()).decode()
    parts = [b64[i:i + max_len - 1] for i in range(0, len(b64), max_len - 1)]
    path = meta.joinpath(*(["@" + p for p in parts[:-1]] + [parts[-1]]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path


def test_moving_metadata_renames_records_and_the_paths_they_hold(tmp_path):
    meta = tmp_path / ".snakemake" / "metadata"
    long = "results/train/" + "m" * 300 + "/shard0.safetensors"  # a name longer than a file name: '@' folders
    _record(meta, long, {"input": ["results/prepare/samples.parquet", "/data/x"], "params": [{"dir": "results"}]})
    kept = _record(meta, "results/other/x.parquet", {"input": []})
    _record(meta, "elsewhere/y", {"input": ["results/z"]})
    assert move_metadata(tmp_path, "results", "results/s") == 2
    moved = _record(tmp_path / "expected", "results/s/train/" + "m" * 300 + "/shard0.safetensors", {})
    new = meta / moved.relative_to(tmp_path / "expected")
    assert json.loads(new.read_text()) == {"input": ["results/s/prepare/samples.parquet", "/data/x"],
                                           "params": [{"dir": "results/s"}]}
    assert not kept.exists() and json.loads(_record(tmp_path / "e2", "elsewhere/y", {}).read_text()) == {}


def test_moving_an_old_layout_keeps_shared_rows_and_new_studies_in_place(tmp_path):
    for f in ("results/prepare/samples.parquet", "results/logs/prepare/prepare.log", "results/benchmarks/b.parquet",
              "results/new/prepare/samples.parquet"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(f)
    _record(tmp_path / ".snakemake" / "metadata", "results/prepare/samples.parquet", {"input": []})
    assert move_old_layout("old", tmp_path).startswith("moved 2 entries of results/ into results/old/ and 1 ")
    assert (tmp_path / "results/old/prepare/samples.parquet").read_text() == "results/prepare/samples.parquet"
    assert (tmp_path / "results/old/logs/prepare/prepare.log").is_file()
    assert (tmp_path / "results/benchmarks/b.parquet").is_file() and (tmp_path / "results/new/prepare").is_dir()
    with pytest.raises(SystemExit, match="not in the old layout"):
        move_old_layout("old", tmp_path)


def _metrics(folder: Path, experiment: str, values: list[float]) -> None:
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"experiment": [experiment] * len(values), "metric": ["accuracy"] * len(values),
                             "value": values}), folder / "m.parquet")


def test_the_views_over_several_studies_carry_their_experiment(tmp_path):
    root = tmp_path / "results"
    _metrics(root / "a" / "metrics" / "evaluate", "a", [0.5, 0.7])
    _metrics(root / "b.2" / "metrics" / "evaluate", "b.2", [0.9])
    pq.write_table(pa.table({"sample_id": ["x", "y", "z"]}), root / "a" / "prepare.parquet")
    (root / "b.2" / "prepare").mkdir()
    pq.write_table(pa.table({"sample_id": ["x"]}), root / "b.2" / "prepare" / "samples.parquet")
    assert list_studies(root) == ["a", "b.2"]
    con = connect_studies(root)
    assert con.sql("SELECT experiment, count(*), sum(value) FROM metrics GROUP BY 1 ORDER BY 1").fetchall() == [
        ("a", 2, pytest.approx(1.2)), ("b.2", 1, pytest.approx(0.9))]
    assert con.sql("SELECT experiment, sample_id FROM samples").fetchall() == [("b.2", "x")]  # only b.2 has one
    assert con.sql('SELECT count(*) FROM "a".metrics').fetchall() == [(2,)]
    assert connect_studies(root, ["b.2"]).sql("SELECT DISTINCT experiment FROM metrics").fetchall() == [("b.2",)]
    with pytest.raises(SystemExit, match="no study c under"):
        connect_studies(root, ["a", "c"])


def test_names_duckdb_cannot_tell_apart_get_schemas_of_their_own(tmp_path):
    """Issue 44, 5.5: `tiny` beside `Tiny`, or `main` beside `study_main`, ended in CatalogException
    (DuckDB's names ignore case; `main` was given `study_main`, another study's name)."""
    root = tmp_path / "results"
    names = ["Tiny", "main", "study_main", "tiny", "TINY"]
    for i, name in enumerate(names):
        _metrics(root / name / "metrics" / "evaluate", name, [float(i)] * (i + 1))
    con = connect_studies(root)
    schemas = dict(con.sql("SELECT experiment, schema FROM studies").fetchall())
    assert schemas == {"Tiny": "^tiny", "main": "study_main", "study_main": "study_study_main", "tiny": "tiny",
                       "TINY": "^t^i^n^y"}
    for i, name in enumerate(names):  # each schema holds its own study's rows only
        rows = con.sql(f'SELECT DISTINCT experiment, count(*) FROM "{schemas[name]}".metrics GROUP BY 1').fetchall()
        assert rows == [(name, i + 1)]
    assert con.sql("SELECT count(*) FROM metrics").fetchall() == [(15,)]


def test_two_report_tables_side_by_side(tmp_path):
    for study, rows in (("a", "method,accuracy\nfc,0.5\ntaft-1,0.6\n"), ("b", "method,accuracy,extra\nfc,0.7,1\n")):
        (tmp_path / study / "report").mkdir(parents=True)
        (tmp_path / study / "report" / "table1_methods.csv").write_text(rows)
    df = compare_tables(tmp_path, "a", "b", "table1_methods")
    assert list(df.columns) == ["method", "accuracy [a]", "accuracy [b]", "extra [b]"]
    assert df.set_index("method")["accuracy [b]"].to_dict() == {"fc": 0.7, "taft-1": pytest.approx(float("nan"), nan_ok=True)}
    with pytest.raises(SystemExit, match="study 'a' has no report table 'claims'.*table1_methods"):
        compare_tables(tmp_path, "a", "b", "claims")
