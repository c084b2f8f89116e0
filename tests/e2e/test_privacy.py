"""A real Snakemake run of a tiny privacy study: DP models of nlft, taft and last in two
regimes at two ε (Table 3 rows), taft-1 also under the paper's protocol (full-batch DP-GD),
then DP taft shards composed by their Δw sum."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from opacus.accountants import RDPAccountant

from pipeline_src.data.sample_store import SampleStore
from pipeline_src.methods.export import export_model
from pipeline_src.methods.loading import load_tuned_model
from pipeline_src.reports.privacy import REPORTS
from pipeline_src.steps.features import load_rows
from pipeline_src.store.audit import audit_model
from pipeline_src.store.private_provenance import load_members
from pipeline_src.store.results_db import connect
from tests.conftest import REPO, planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e
METHODS, REGIMES, EPSILONS = ["nlft-1", "taft-1", "last"], ["full", "fc"], [1, 8]
PUBLIC_SIZE = 500  # the declared size DP jobs plan from (the training split holds 527)
PAPER = {"methods": ["taft-1"], "regimes": ["fc"], "epochs": 3}  # the paper protocol beside ours



def study_config(**privacy) -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg.pop("fusion", None), cfg.pop("forget", None), cfg.pop("search", None)  # only the privacy study here
    cfg["methods"]["last"] = {"kind": "last", "rank": 8, "heads": 2}
    cfg["privacy"] = {"enabled": True, "epochs": 2, "batch_size": 64, "public_train_size": PUBLIC_SIZE, **privacy}
    return cfg


def write_config(workdir: Path, **privacy) -> None:
    (workdir / "config.yaml").write_text(yaml.safe_dump(study_config(**privacy)))


FIRST = dict(methods=METHODS, regimes=REGIMES, epsilons=EPSILONS, shards=[1], paper=PAPER)  # the study's first run


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_study) -> Path:
    """N = 1 for every method, regime and ε; then taft at N = 2 in one regime and ε."""
    workdir = copy_study(tiny_study, tmp_path_factory.mktemp("privacy"))
    write_config(workdir, **FIRST)
    snakemake(workdir, "--cores", "2", "privacy")
    write_config(workdir, methods=["taft-1"], regimes=["fc"], epsilons=[8], shards=[2])
    snakemake(workdir, "--cores", "2", "privacy")
    return workdir


def test_table3_has_a_row_per_method_and_regime_and_a_column_per_epsilon(study):
    out = results_of(study) / "report"
    out.mkdir(parents=True, exist_ok=True)
    con = connect(results_of(study))
    paths = [p for report in REPORTS.values() for p in report(con, out)]
    assert {p.name for p in paths} >= {"privacy_table3.md", "privacy_table3.csv", "privacy_composition.csv",
                                       "privacy_accuracy.png"}
    table = duckdb.read_csv(str(out / "privacy_table3.csv")).df()
    assert list(table.columns) == ["method", "regime", "protocol", "ε=1", "ε=8"]
    assert sorted(zip(table.method, table.regime, table.protocol)) == sorted(
        [(m, r, "ours") for m in METHODS for r in REGIMES] + [("taft-1", "fc", "paper")])
    values = table[["ε=1", "ε=8"]].to_numpy()
    assert ((values >= 0) & (values <= 1)).all()
    assert (out / "privacy_accuracy.png").stat().st_size > 1000


def test_recorded_epsilon_equals_opacus_accountant(study):
    records = sorted((results_of(study) / "private").rglob("shard*.json"))
    assert len(records) == len(METHODS) * len(REGIMES) * len(EPSILONS) + len(EPSILONS) + 2
    metrics = duckdb.sql(f"""SELECT json_extract_string(variant, '$.protocol') AS protocol, method,
        json_extract_string(variant, '$.regime') AS regime, shards, shard_id,
        CAST(json_extract(variant, '$.epsilon') AS DOUBLE) AS target, value FROM
        read_parquet('{results_of(study)}/metrics/private/**/shard*.parquet') WHERE metric = 'epsilon'""").fetchall()
    reported = {(pr, m, r, n, s, t): v for pr, m, r, n, s, t, v in metrics}
    for path in records:
        rec = json.loads(path.read_text())
        p = rec["privacy"]
        acc = RDPAccountant()  # the reference: one accountant step per DP-SGD step taken
        for _ in range(p["steps_taken"]):
            acc.step(noise_multiplier=p["sigma"], sample_rate=p["sample_rate"])
        eps = acc.get_epsilon(delta=p["delta"])
        assert p["epsilon_spent"] == pytest.approx(eps, rel=1e-9), path
        assert p["epsilon"] - 0.02 < eps <= p["epsilon"], path
        protocol = rec["dp_settings"]["protocol"]
        if protocol == "paper":  # TAFT App. A: one full-batch step per epoch, CE, J·Δw only
            assert p["sample_rate"] == 1.0 and p["steps_taken"] == p["steps"] == PAPER["epochs"]
            assert rec["method_config"]["loss"] == "ce" and rec["method_config"]["jvp_only"] is True
        else:
            assert p["steps_taken"] == p["steps"] and p["sample_rate"] == 1 / -(-(PUBLIC_SIZE // rec["shards"]) // 64)
        assert p["max_grad_norm"] == 1.0 and p["accountant"] == "rdp" and len(rec["commit"]) >= 7
        assert "sample_ids" not in rec and "num_samples" not in rec and p["public_size"] == PUBLIC_SIZE // rec["shards"]
        assert p["neighbouring"].startswith("add/remove") and "seed" not in p
        key = (protocol, rec["method"], rec["regime"], rec["shards"], rec["shard_id"], p["epsilon"])
        assert reported[key] == pytest.approx(p["epsilon_spent"], rel=1e-12)


def test_a_dp_studys_private_files_are_owner_only(study):
    """The manifests of the DP shards (written 0644 by the non-DP tiny study first) and the
    provenance store end 0600, whatever the umask (the release boundary, docs/privacy.md)."""
    import stat

    results = results_of(study)
    files = [results / f"split/n{n}_s0/shard{i}.parquet" for n in (1, 2) for i in range(n)]
    files += [p for p in (results / "provenance").rglob("*") if p.is_file()]
    assert len(files) > 4
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_dp_per_image_records_are_owner_only_name_test_images_and_decide_table3(study, tmp_path):
    """The DP evaluations' per-image files: owner-only (private workspace), test images only (so
    no member), each model's test accuracy back; the claims' Table 3 rows get the paired test."""
    import stat

    from pipeline_src.reports.claims import claims_report

    results = results_of(study)
    files = sorted((results / "per_image" / "private").rglob("*.parquet"))
    assert len(files) == len(list((results / "metrics" / "private").rglob("*.parquet"))) > 10
    for p in [*files, *{f.parent for f in files}]:
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p
    con = connect(results)
    test_ids = {r[0] for r in con.sql("SELECT sample_id FROM samples WHERE task = 'target' AND split = 'test'").fetchall()}
    dp = "json_extract_string(variant, '$.study') = 'privacy'"
    assert {r[0] for r in con.sql(f"SELECT DISTINCT sample_id FROM per_image WHERE {dp}").fetchall()} == test_ids
    keys = "method, model, shards, coalesce(shard_id, -1), seed, variant"
    acc = dict(con.sql(f"SELECT ({keys}), avg(correct::DOUBLE) FROM per_image WHERE {dp} GROUP BY ALL").fetchall())
    want = dict(con.sql(f"SELECT ({keys}), value FROM metrics WHERE {dp} AND metric = 'accuracy'").fetchall())
    assert acc.keys() == want.keys() and all(abs(acc[k] - want[k]) < 1e-12 for k in want)
    _, table = claims_report(con, tmp_path, yaml.safe_load((study / "config.yaml").read_text()))
    claims = {r["claim"]: r for r in duckdb.read_csv(str(table)).df().fillna("").to_dict("records")}
    for eps in EPSILONS:
        row = claims[f"DP TAFT ≥ DP NLFT, ε = {eps} (ours protocol)"]
        assert "paired bootstrap over 1 seed and" in row["paired test: estimate [95 % interval]"], row
        assert "each image's gap the mean over regime = fc, full" in row["paired test: estimate [95 % interval]"]
        assert row["verdict vs the paper's row"] in ("agrees", "disagrees", "undecided"), row


def test_regimes_train_only_their_parameters(study):
    for method in METHODS:
        rec = json.loads((results_of(study) / f"private/ours/{method}/fc/eps8/n1_s0/shard0.json").read_text())
        head = {"nlft-1": "model.head.", "taft-1": "head.delta.", "last": "side.head."}[method]
        assert sorted(rec["trained_parameters"]) == [head + "bias", head + "weight"]
        full = json.loads((results_of(study) / f"private/ours/{method}/full/eps8/n1_s0/shard0.json").read_text())
        assert len(full["trained_parameters"]) > 4


def test_dp_taft_shards_compose_to_their_ensemble(study):
    base = results_of(study) / "private" / "ours" / "taft-1" / "fc" / "eps8" / "n2_s0"
    soup = json.loads((base / "soup.json").read_text())
    shards = [json.loads((base / f"shard{i}.json").read_text()) for i in range(2)]
    members = [set(load_members(results_of(study), s["membership_ref"])) for s in shards]
    assert members == [set(pq.read_table(results_of(study) / f"split/n2_s0/shard{i}.parquet").column("sample_id")
                           .to_pylist()) for i in range(2)]
    assert not members[0] & members[1]
    assert soup["privacy"]["epsilon_spent"] == max(s["privacy"]["epsilon_spent"] for s in shards) <= 8
    # the composed Δw sum equals the explicit ensemble (mean logits) of the shard models
    store = SampleStore(results_of(study) / "prepare" / "samples.parquet")
    ids = store.ids("target", "test")[:64]
    h = load_rows(results_of(study) / "features" / "last1" / "features.npy", store.rows(ids))
    backbone = results_of(study) / "pretrain"
    with torch.no_grad():
        logits = [load_tuned_model(backbone, base / f"{n}.safetensors")[0].eval().double().forward_from_prefix(h.double())
                  for n in ("shard0", "shard1", "soup")]
    torch.testing.assert_close(logits[2], (logits[0] + logits[1]) / 2, rtol=1e-5, atol=1e-6)  # Δ stored in float32
    rows = dict(duckdb.sql(f"""SELECT model || '/' || metric, value FROM
        read_parquet('{results_of(study)}/metrics/private/ours/taft-1/fc/eps8/n2_s0/*.parquet')""").fetchall())
    assert set(rows) >= {"dp-soup/accuracy", "dp-soup/epsilon", "dp-shard/accuracy"}


def test_nothing_to_do_after_the_run(study):
    proc = snakemake(study, "-n", "--cores", "2", "privacy")
    assert "Nothing to be done" in proc.stdout + proc.stderr


@pytest.mark.parametrize("change, planned", [
    ({"train": {"lr": 0.5}}, set()),  # the train: block: DP jobs train with privacy: settings
    ({"privacy": {**FIRST, "epsilons": [*EPSILONS, 4]}}, {f"{p}/{m}/{r}/eps4" for p, m, r in (
        *(("ours", m, r) for m in METHODS for r in REGIMES), ("paper", "taft-1", "fc"))}),  # new ε: new jobs only
    ({"privacy": {**FIRST, "delta": 1e-6}}, {f"{p}/{m}/{r}/eps{e}" for e in EPSILONS for p, m, r in (
        *(("ours", m, r) for m in METHODS for r in REGIMES), ("paper", "taft-1", "fc"))}),
    ({"privacy": {**FIRST, "jvp_only": True}}, {f"ours/taft-1/{r}/eps{e}" for r in REGIMES for e in EPSILONS}),
], ids=["train.lr", "privacy.epsilons", "privacy.delta", "privacy.jvp_only"])
def test_a_changed_setting_reruns_the_dp_jobs_that_read_it_only(study, tmp_path, change, planned):
    """train_private's settings (plan/step_settings.py): privacy.delta reruns every DP job,
    privacy.jvp_only the taft jobs of protocol ours only (the paper's always predict from J·Δw)."""
    cfg = study_config(**FIRST)
    for key, value in change.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    outputs = planned_outputs(snakemake(study, "-n", "--cores", "2", "privacy", "--configfile",
                                        str(tmp_path / "config.yaml")))
    trained = {"/".join(o.split("/")[3:7]) for o in outputs if o.startswith("results/tiny/private/") and "/shard" in o}
    assert trained == planned


def _all_member_ids(study: Path) -> set[str]:
    ids = set()
    for manifest in (results_of(study) / "split").rglob("shard*.parquet"):
        ids |= set(pq.read_table(manifest).column("sample_id").to_pylist())
    return ids


def test_no_file_written_for_a_dp_model_names_a_member(study, tmp_path):
    """Records, weights, metrics, logs and an export of every DP model: no member's sample id
    (which also carries its label) appears in any of them."""
    members = _all_member_ids(study)
    assert len(members) > 100
    export_model(results_of(study) / "private/ours/taft-1/fc/eps8/n2_s0/soup.safetensors", tmp_path / "export")
    files = [f for root in ("results/tiny/private", "results/tiny/metrics/private", "results/tiny/per_image/private",
                            "results/tiny/logs/train_private",
                            "results/tiny/logs/compose_private", "results/tiny/logs/evaluate_private")
             for f in (study / root).rglob("*") if f.is_file()]
    files += [f for f in (tmp_path / "export").rglob("*") if f.is_file()]
    assert len(files) > 40
    for f in files:
        data = f.read_bytes()
        leaked = [i for i in members if i.encode() in data]
        assert not leaked, (f, leaked[:3])


def test_audit_resolves_dp_members_from_the_private_store(study, tmp_path, monkeypatch):
    soup = results_of(study) / "private/ours/taft-1/fc/eps8/n2_s0/soup.safetensors"
    member = sorted(load_members(results_of(study), json.loads((soup.parent / "shard1.json").read_text())
                                 ["membership_ref"]))[0]
    monkeypatch.chdir(tmp_path)  # paths resolve inside the model's own results tree, not the cwd
    result = audit_model(soup, [member])
    assert [p for p, _ in result.hits] == [str(soup.parent.resolve() / "shard1.safetensors")]
    store = SampleStore(results_of(study) / "prepare" / "samples.parquet")
    assert audit_model(soup, store.ids("target", "test")[:5]).clean


def test_exported_dp_model_loads_in_a_fresh_process_with_the_same_logits(study, tmp_path):
    soup = results_of(study) / "private/ours/taft-1/fc/eps8/n2_s0/soup.safetensors"
    dest = export_model(soup, tmp_path / "shared" / "taft-dp")
    record = json.loads((dest / "model.json").read_text())
    assert {"epsilon", "delta", "sigma", "max_grad_norm", "sample_rate", "steps", "accountant"} <= set(
        record["privacy"]["components"][0]) and "membership_ref" not in json.dumps(record)
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        expected = load_tuned_model(results_of(study) / "pretrain", soup)[0].eval()(x)
    code = ("import sys, torch; from pipeline_src.methods.export import load_exported; "
            "m, _, _ = load_exported(sys.argv[1]); x = torch.load(sys.argv[2], weights_only=True); "
            "torch.save(m(x).detach(), sys.argv[3])")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run([sys.executable, "-c", code, str(dest), str(tmp_path / "x.pt"), str(tmp_path / "y.pt")],
                   cwd=elsewhere, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    torch.testing.assert_close(torch.load(tmp_path / "y.pt", weights_only=True), expected)
    with pytest.raises(FileExistsError):
        export_model(soup, dest)
