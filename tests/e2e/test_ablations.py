"""The TAFT ablation study (`studies.ablations`: Fig. 2 and Table 12) through Snakemake on a tiny
config: every variant trains as the `train` step would with its settings, and the reports tabulate them."""
from __future__ import annotations

import duckdb
import pandas as pd
import pytest
import yaml

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.reports.ablations import taft_ablations
from pipeline_src.store.model_io import load_model
from pipeline_src.store.results_db import connect
from tests.conftest import REPO, planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e
ABLATIONS = {"enabled": True, "losses": ["rsl"], "radii": [None, 0.5], "l2s": [0.0]}


def _config() -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["methods"] = {"taft-1": cfg["methods"]["taft-1"]}
    cfg["search"] = {"enabled": False}  # it names fc (tests/e2e/test_search.py runs it)
    cfg["shards"] = [1]
    for study in ("fusion", "forget", "last_grid"):
        cfg.pop(study, None)
    cfg["studies"] = {"ablations": ABLATIONS}
    return cfg


def test_config_refuses_a_non_tangent_method():
    cfg = _config()
    cfg["methods"]["fc"] = {"kind": "fc"}
    cfg["studies"]["ablations"] = {**ABLATIONS, "method": "fc"}
    with pytest.raises(ConfigError, match="config key 'studies.ablations.method'.*tangent"):
        validate_config(cfg, count_samples=False)


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_study):
    workdir = copy_study(tiny_study, tmp_path_factory.mktemp("ablations"), parts=None)  # only the ablation jobs run
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config()))
    planned = planned_outputs(snakemake(workdir, "-n", "--cores", "2", "ablations"))
    assert sum("results/tiny/metrics/ablation/taft-1/" in p for p in planned) == 4 + 2
    snakemake(workdir, "--cores", "2", "ablations", "evaluate_all")
    return workdir


def test_every_variant_and_the_base_point_equals_the_train_step(study):
    rows = duckdb.sql(f"""SELECT json_extract_string(variant, '$.point') AS point, metric, value FROM
        read_parquet('{results_of(study)}/metrics/ablation/**/*.parquet')""").df()
    acc = rows[rows.metric == "accuracy"].set_index("point").value
    assert len(acc) == 6 and acc.between(0, 1).all()
    dist = rows[rows.metric == "weight_distance"].set_index("point").value
    # PGD keeps ‖Δw‖ ≤ R (up to the float32 rounding of the stored Δ)
    assert dist["table12_r-0.5_l2-0"] <= 0.5 * (1 + 1e-6) and dist["table12_r-none_l2-0"] > 0.5
    # the point with the method's own settings (loss rsl, PT = T, CLS = F) trains the DAG's model
    _, record = load_model(results_of(study) / "train/taft-1/n1_s0/shard0.safetensors")
    assert record["method_config"] == {"kind": "taft", "k": 1}
    own = duckdb.sql(f"""SELECT value FROM read_parquet('{results_of(study)}/metrics/evaluate/taft-1/n1_s0/shards.parquet')
        WHERE metric = 'accuracy'""").fetchall()[0][0]
    assert acc["fig2_loss-rsl_pt-T_cls-F"] == pytest.approx(own, abs=1e-12)


def test_reports(study, tmp_path):
    paths = taft_ablations(connect(results_of(study)), tmp_path)
    assert {p.name for p in paths} == {"fig2_ablation.md", "fig2_ablation.csv", "table12_radius.md",
                                       "table12_radius.csv"}
    fig2 = pd.read_csv(tmp_path / "fig2_ablation.csv", dtype=str)
    assert sorted(zip(fig2.PT, fig2.CLS)) == [("F", "F"), ("F", "T"), ("T", "F"), ("T", "T")]
    t12 = pd.read_csv(tmp_path / "table12_radius.csv", dtype=str)
    assert sorted(t12.radius.astype(str)) == ["0.5", "none"] and list(t12.columns)[-1] == "l2=0"
