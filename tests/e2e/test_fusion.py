"""A real Snakemake run of the tiny study with the fusion study switched on (.test/fusion.yaml)."""
from __future__ import annotations

import json

import duckdb
import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_study):
    workdir = copy_study(tiny_study, tmp_path_factory.mktemp("fusion_study"), parts=None)  # its shard models too
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg.update(yaml.safe_load((REPO / ".test" / "fusion.yaml").read_text()))
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(workdir, "--cores", "2")
    return workdir, cfg


def fusion_rows(workdir, where: str) -> pd.DataFrame:
    return duckdb.sql(f"""SELECT method, model, shard_id, metric, value,
            json_extract_string(variant, '$.init') AS init, json_extract_string(variant, '$.matching') AS matching
        FROM read_parquet(['{results_of(workdir)}/metrics/fusion_match/**/*.parquet',
                           '{results_of(workdir)}/metrics/fuse/**/*.parquet'], union_by_name=true)
        WHERE {where}""").df()


def test_report_has_a_table2_row_per_method_init_and_fusion(study):
    workdir, cfg = study
    fus = cfg["fusion"]
    table = pd.read_csv(results_of(workdir) / "report" / "fusion_table2.csv")
    assert len(table) == len(cfg["methods"]) * 2 * (1 + 3)  # inits x (shard mean + soup, fisher, regmean)
    assert list(table.columns) == ["method", "N", "init", "fusion", *fus["matching"]]
    assert table[fus["matching"]].stack().between(0, 1).all()
    # matching keeps each shard model's function: its accuracy is the same in every column
    shard = table[table.fusion == "shard (mean)"]
    assert (shard[fus["matching"]].nunique(axis=1) == 1).all()
    assert (results_of(workdir) / "report" / "fusion_figure3.png").stat().st_size > 0
    index = (results_of(workdir) / "report" / "index.md").read_text()
    assert "fusion_table2.md" in index and "fusion_figure3.png" in index


def test_matched_models_keep_their_logits_and_move_towards_the_anchor(study):
    workdir, _ = study
    change = fusion_rows(workdir, "metric = 'logits_max_change'")
    assert len(change) > 0 and change.value.max() < 1e-5
    dist = fusion_rows(workdir, "metric = 'anchor_distance'").pivot_table(
        index=["method", "init", "shard_id"], columns="matching", values="value")
    assert (dist["rotation-scaling"] <= dist["permutation"] + 1e-6).all()
    assert (dist["permutation"] <= dist["none"] + 1e-6).all()
    reinit = dist.xs("random_reinit", level="init")
    assert (reinit["rotation-scaling"] < 0.99 * reinit["none"]).all()  # different inits: matching pays


def test_random_reinit_models_record_their_own_inits(study):
    workdir, _ = study
    records = [json.loads(p.read_text()) for p in sorted((results_of(workdir) / "fusion_train").rglob("*.json"))]
    assert len(records) == 2 * 2  # methods x shards
    assert len({(r["method"], r["reinit_seed"]) for r in records}) == 4
    assert all(r["method_config"]["init_seed"] == r["reinit_seed"] for r in records if r["method"] == "last")


def test_changing_regmean_alpha_reruns_only_regmean(study):
    workdir, cfg = study
    changed = {**cfg, "fusion": {**cfg["fusion"], "regmean_alpha": 0.5}}
    (workdir / "changed.yaml").write_text(yaml.safe_dump(changed))
    proc = snakemake(workdir, "-n", "--cores", "2", "--configfile", str(workdir / "changed.yaml"))
    outputs = [o for o in planned_outputs(proc) if "/fuse/" in o]
    assert outputs and all("regmean" in o for o in outputs)
    assert not any("fusion_train" in o or "fusion_match" in o for o in planned_outputs(proc))


def test_audit_reads_every_fused_model(study, tmp_path, monkeypatch):
    """Fused models record their components in the common {path, shard_id} format: the audit walks
    them (it raised TypeError on bare path strings), from any working directory."""
    from pipeline_src.store.audit import audit_model

    workdir, _ = study
    fused = sorted((results_of(workdir) / "fuse").rglob("*.safetensors"))
    assert fused
    monkeypatch.chdir(tmp_path)
    for model in fused:
        record = json.loads(model.with_suffix(".json").read_text())
        members = {i for c in record["components"]
                   for i in json.loads((workdir / c["path"]).with_suffix(".json").read_text())["sample_ids"]}
        member = sorted(members)[0]
        result = audit_model(model, [member])
        assert len(result.hits) == 1 and result.hits[0][1] == [member] and not result.stale, model
        assert audit_model(model, ["digits/0/0000"]).clean  # a source-task id: no component trained on it
