"""The LAST grid study (config `last_grid:`): config checks, and a real Snakemake run of the
tiny study restricted to the grid (plus the base method's own shard model to compare with)."""
from __future__ import annotations

import copy

import duckdb
import pytest
import yaml

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.last_grid import grid_points, point_label
from pipeline_src.reports.last_grid import last_grid
from pipeline_src.store.results_db import connect
from tests.conftest import REPO, planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study

TINY = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())


def with_grid(**grid) -> dict:
    cfg = copy.deepcopy(TINY)
    cfg["last_grid"] = {"enabled": True, **grid}
    return cfg


@pytest.mark.parametrize("grid,key,words", [
    ({"method": "nope"}, "last_grid.method", "unknown method 'nope'"),
    ({"method": "fc"}, "last_grid.method", "kind 'fc'"),
    ({"ranks": [8, 6], "heads": [2, 4]}, "last_grid.heads", "do not divide rank"),
    ({"every": [3]}, "last_grid.every", "must divide backbone depth"),
    ({"lrs": [0]}, "last_grid.lrs.0", ""),
    ({"shards": []}, "last_grid.shards", ""),
    ({"bogus": 1}, "last_grid", "bogus"),
])
def test_config_errors_name_the_key(grid, key, words):
    with pytest.raises(ConfigError, match=rf"config key '{key}'.*{words}"):
        validate_config(with_grid(**grid), count_samples=False)


def test_grid_is_the_product_over_the_base_method():
    cfg = validate_config(with_grid(lrs=[0.01, 0.1], ranks=[4, 8], init_seeds=[0, 1]), count_samples=False)
    points = grid_points(cfg)
    assert len(points) == 8 and len({point_label(p) for p in points}) == 8
    assert {p["heads"] for p in points} == {2} and {p["every"] for p in points} == {2}  # the base method's values
    assert {p["modules_per_block"] for p in points} == {2} and {p["bias_correction"] for p in points} == {True}
    assert validate_config(TINY, count_samples=False)["last_grid"]["shards"] == [1]
    off = copy.deepcopy(TINY)
    off.pop("last_grid")
    assert validate_config(off, count_samples=False)["last_grid"]["enabled"] is False  # off by default


def test_bias_correction_is_an_axis_and_an_ffn_base_is_refused():
    cfg = validate_config(with_grid(lrs=[0.01, 0.1], bias_corrections=[True, False]), count_samples=False)
    points = grid_points(cfg)
    assert sorted((p["lr"], p["bias_correction"]) for p in points) == [(0.01, False), (0.01, True), (0.1, False),
                                                                        (0.1, True)]
    assert {point_label(p).split(",bc=")[1][0] for p in points} == {"0", "1"}
    ffn = with_grid()
    ffn["methods"]["last"] = {**ffn["methods"]["last"], "ffn_hidden": 4}
    with pytest.raises(ConfigError, match="config key 'last_grid.method'.*FFN"):
        validate_config(ffn, count_samples=False)


BASE_EVAL = "results/tiny/metrics/evaluate/last/n1_s0/shards.parquet"


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_study):
    workdir = copy_study(tiny_study, tmp_path_factory.mktemp("last_grid_study"))
    (workdir / "config.yaml").write_text(yaml.safe_dump(TINY))
    # The report depends on the grid's metrics file (STUDY_METRICS).
    dry = snakemake(workdir, "-n", "--cores", "1", "report")
    assert "results/tiny/metrics/last_grid/last/n1_s0.parquet" in planned_outputs(dry)
    snakemake(workdir, "--cores", "2", "last_grid_study", BASE_EVAL)
    return workdir, validate_config(TINY, count_samples=False)


def grid_metrics(workdir):
    return duckdb.sql(f"""SELECT *, json_extract_string(variant, '$.study') AS study
                          FROM read_parquet('{results_of(workdir)}/metrics/last_grid/**/*.parquet')""").df()


@pytest.mark.e2e
def test_one_row_per_member_split_and_metric(study):
    workdir, cfg = study
    rows = grid_metrics(workdir)
    members = len(grid_points(cfg))
    assert members == 2
    assert len(rows) == members * 2 * 2  # members x (val, test) x (accuracy, loss)
    assert set(rows.study) == {"last_grid"} and set(rows.model) == {"last-grid"} and set(rows.method) == {"last"}
    assert rows.groupby(["variant", "split", "metric"]).size().eq(1).all()
    assert rows[rows.metric == "accuracy"].value.between(0, 1).all()
    assert (results_of(workdir) / "logs" / "last_grid" / "last" / "n1_s0.bench.tsv").exists()


@pytest.mark.e2e
def test_report_table_has_one_row_per_grid_point(study, tmp_path):
    workdir, cfg = study
    paths = last_grid(connect(results_of(workdir)), tmp_path)
    assert [p.name for p in paths] == ["last_grid.md", "last_grid.csv", "last_grid.png"]
    import pandas as pd

    table = pd.read_csv(tmp_path / "last_grid.csv")
    assert len(table) == len(grid_points(cfg))
    assert sorted(table.lr) == [0.001, 0.003]
    assert table.val_accuracy.is_monotonic_decreasing  # best first
    assert table[["val_accuracy", "test_accuracy"]].stack().between(0, 1).all()
    assert last_grid(duckdb.connect(), tmp_path / "none") == []  # no grid rows, no report


@pytest.mark.e2e
def test_base_member_equals_the_last_train_step(study):
    # The grid point with the base method's settings (lr 0.001 = train.lr, rank 8, heads 2) is
    # the `last` shard model trained alone by the `train` step, evaluated by `evaluate`.
    workdir, _ = study
    rows = grid_metrics(workdir)
    base = rows[(rows.split == "test") & rows.variant.str.contains('"lr": 0.001')].set_index("metric").value
    alone = duckdb.sql(f"SELECT metric, value FROM read_parquet('{workdir}/{BASE_EVAL}')").df().set_index("metric").value
    assert base["accuracy"] == pytest.approx(alone["accuracy"], abs=1e-9)
    assert base["loss"] == pytest.approx(alone["loss"], abs=1e-4)
