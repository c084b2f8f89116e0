"""A real Snakemake run of a tiny privacy study: DP models of nlft, taft and last in two
regimes at two ε (Table 3 rows), then DP taft shards composed by their Δw sum."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch
import yaml
from opacus.accountants import RDPAccountant

from pipeline_src.data.sample_store import SampleStore
from pipeline_src.methods.loading import load_tuned_model
from pipeline_src.reports.privacy import REPORTS
from pipeline_src.steps.features import load_rows
from pipeline_src.store.results_db import connect
from tests.conftest import REPO, snakemake

pytestmark = pytest.mark.e2e
METHODS, REGIMES, EPSILONS = ["nlft-1", "taft-1", "last"], ["full", "fc"], [1, 8]



def write_config(workdir: Path, **privacy) -> None:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg.pop("fusion", None), cfg.pop("forget", None)  # only the privacy study here
    cfg["methods"]["last"] = {"kind": "last", "rank": 8, "heads": 2}
    cfg["privacy"] = {"enabled": True, "epochs": 2, "batch_size": 64, **privacy}
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """N = 1 for every method, regime and ε; then taft at N = 2 in one regime and ε."""
    workdir = tmp_path_factory.mktemp("privacy")
    write_config(workdir, methods=METHODS, regimes=REGIMES, epsilons=EPSILONS, shards=[1])
    snakemake(workdir, "--cores", "2", "privacy")
    write_config(workdir, methods=["taft-1"], regimes=["fc"], epsilons=[8], shards=[2])
    snakemake(workdir, "--cores", "2", "privacy")
    return workdir


def test_table3_has_a_row_per_method_and_regime_and_a_column_per_epsilon(study):
    out = study / "results" / "report"
    out.mkdir(parents=True, exist_ok=True)
    con = connect(study / "results")
    paths = [p for report in REPORTS.values() for p in report(con, out)]
    assert {p.name for p in paths} >= {"privacy_table3.md", "privacy_table3.csv", "privacy_composition.csv",
                                       "privacy_accuracy.png"}
    table = duckdb.read_csv(str(out / "privacy_table3.csv")).df()
    assert list(table.columns) == ["method", "regime", "ε=1", "ε=8"]
    assert sorted(zip(table.method, table.regime)) == sorted((m, r) for m in METHODS for r in REGIMES)
    values = table[["ε=1", "ε=8"]].to_numpy()
    assert ((values >= 0) & (values <= 1)).all()
    assert (out / "privacy_accuracy.png").stat().st_size > 1000


def test_recorded_epsilon_equals_opacus_accountant(study):
    records = sorted((study / "results" / "private").rglob("shard*.json"))
    assert len(records) == len(METHODS) * len(REGIMES) * len(EPSILONS) + 2
    metrics = duckdb.sql(f"""SELECT method, json_extract_string(variant, '$.regime') AS regime, shards, shard_id,
        CAST(json_extract(variant, '$.epsilon') AS DOUBLE) AS target, value FROM
        read_parquet('{study}/results/metrics/private/**/shard*.parquet') WHERE metric = 'epsilon'""").fetchall()
    reported = {(m, r, n, s, t): v for m, r, n, s, t, v in metrics}
    for path in records:
        rec = json.loads(path.read_text())
        p = rec["privacy"]
        acc = RDPAccountant()  # the reference: one accountant step per DP-SGD step taken
        for _ in range(p["steps_taken"]):
            acc.step(noise_multiplier=p["sigma"], sample_rate=p["sample_rate"])
        eps = acc.get_epsilon(delta=p["delta"])
        assert p["epsilon_spent"] == pytest.approx(eps, rel=1e-9), path
        assert p["epsilon"] - 0.02 < eps <= p["epsilon"], path
        assert p["steps_taken"] == p["steps"] and p["sample_rate"] == 1 / -(-rec["num_samples"] // 64)
        assert p["max_grad_norm"] == 1.0 and p["accountant"] == "rdp" and len(rec["commit"]) >= 7
        assert len(rec["sample_ids"]) == rec["num_samples"] == p["n_samples"]
        key = (rec["method"], rec["regime"], rec["shards"], rec["shard_id"], p["epsilon"])
        assert reported[key] == pytest.approx(p["epsilon_spent"], rel=1e-12)


def test_regimes_train_only_their_parameters(study):
    for method in METHODS:
        rec = json.loads((study / f"results/private/{method}/fc/eps8/n1_s0/shard0.json").read_text())
        head = {"nlft-1": "model.head.", "taft-1": "head.delta.", "last": "side.head."}[method]
        assert sorted(rec["trained_parameters"]) == [head + "bias", head + "weight"]
        full = json.loads((study / f"results/private/{method}/full/eps8/n1_s0/shard0.json").read_text())
        assert len(full["trained_parameters"]) > 4


def test_dp_taft_shards_compose_to_their_ensemble(study):
    base = study / "results" / "private" / "taft-1" / "fc" / "eps8" / "n2_s0"
    soup = json.loads((base / "soup.json").read_text())
    shards = [json.loads((base / f"shard{i}.json").read_text()) for i in range(2)]
    assert set(soup["sample_ids"]) == set(shards[0]["sample_ids"]) | set(shards[1]["sample_ids"])
    assert not set(shards[0]["sample_ids"]) & set(shards[1]["sample_ids"])
    assert soup["privacy"]["epsilon_spent"] == max(s["privacy"]["epsilon_spent"] for s in shards) <= 8
    # the composed Δw sum equals the explicit ensemble (mean logits) of the shard models
    store = SampleStore(study / "results" / "prepare" / "samples.parquet")
    ids = store.ids("target", "test")[:64]
    h = load_rows(study / "results" / "features" / "last1" / "features.safetensors", [store.row_of[i] for i in ids])
    backbone = study / "results" / "pretrain"
    with torch.no_grad():
        logits = [load_tuned_model(backbone, base / f"{n}.safetensors")[0].eval().double().forward_from_prefix(h.double())
                  for n in ("shard0", "shard1", "soup")]
    torch.testing.assert_close(logits[2], (logits[0] + logits[1]) / 2, rtol=1e-5, atol=1e-6)  # Δ stored in float32
    rows = dict(duckdb.sql(f"""SELECT model || '/' || metric, value FROM
        read_parquet('{study}/results/metrics/private/taft-1/fc/eps8/n2_s0/*.parquet')""").fetchall())
    assert set(rows) >= {"dp-soup/accuracy", "dp-soup/epsilon", "dp-shard/accuracy"}


def test_nothing_to_do_after_the_run(study):
    proc = snakemake(study, "-n", "--cores", "2", "privacy")
    assert "Nothing to be done" in proc.stdout + proc.stderr
