"""The unlearning study through Snakemake on a tiny config, the audit of its models, its report,
and forget requests through the DAG (dry runs)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from pipeline_src.data.images import to_model_input
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.methods.evaluation import classification_metrics
from pipeline_src.methods.loading import load_tuned_model
from pipeline_src.plan.forget import forgotten_by_shard
from pipeline_src.plan.sharding import shard_ids
from pipeline_src.store.audit import audit_model
from pipeline_src.store.model_io import load_model
from tests.conftest import REPO, planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study

pytestmark = pytest.mark.e2e
TARGETS = ["evaluate_all", "unlearning"]  # not `all`: the report of the other studies is not under test here




def _config() -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["methods"] = {k: v for k, v in cfg["methods"].items() if k in ("taft-1", "nlft-1")}
    cfg["search"] = {"enabled": False}  # it names fc (tests/e2e/test_search.py runs it)
    cfg["fusion"] = {"enabled": False}  # the fusion and grid studies name methods dropped here
    cfg["last_grid"] = {"enabled": False}
    cfg["forget"] = {"study": {"enabled": True, "methods": ["taft-1", "nlft-1"], "shards": [3],
                               "removed_shards": [1], "requests_per_point": 1, "forget_fractions": [0.01, 0.3]}}
    return cfg


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_study) -> Path:
    workdir = copy_study(tiny_study, tmp_path_factory.mktemp("unlearning"), parts=None)  # the same forget study: reused
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config()))
    snakemake(workdir, *TARGETS, "--cores", "2")
    return workdir


def _metrics(study: Path, step: str):
    return duckdb.sql(f"SELECT * FROM read_parquet('{results_of(study)}/metrics/{step}/**/*.parquet', union_by_name=true)").df()


def test_study_writes_every_strategy(study):
    drop, retrain, paragon = (_metrics(study, s) for s in ("unlearn_drop", "unlearn_retrain", "unlearn_paragon"))
    acc = lambda df: df[df.metric == "accuracy"]  # noqa: E731
    assert set(acc(drop).model) == {"subtract", "sisa-drop"} and len(acc(drop)) == 2 * 2  # r = 0 and r = 1
    assert set(acc(retrain).model) == {"retrain-shard", "sisa-retrain"} and len(acc(retrain)) == 2 * 3
    assert set(acc(paragon).model) == {"paragon"} and len(acc(paragon)) == 2 * 2
    # TAFT App. C.3's paragon: the non-linear model (nlft-1) retrained, for the tangent method only
    nonlinear = acc(_metrics(study, "unlearn_paragon_nonlinear"))
    assert set(nonlinear.model) == {"paragon-nonlinear"} and set(nonlinear.method) == {"taft-1"} and len(nonlinear) == 2
    for path in sorted((results_of(study) / "unlearn_paragon_nonlinear/taft-1/s0").glob("*.safetensors")):
        _, rec = load_model(path)
        _, same = load_model(results_of(study) / "unlearn_paragon/taft-1/s0" / path.name)
        assert rec["method"] == "nlft-1" and rec["method_config"] == {"kind": "nlft", "k": 1}
        assert rec["paragon_of"] == "taft-1" and rec["forgotten_ids"] == same["forgotten_ids"]
        assert rec["sample_ids"] == same["sample_ids"] and audit_model(path, rec["forgotten_ids"]).clean
    assert all(0 <= v <= 1 for v in acc(drop).value.tolist() + acc(retrain).value.tolist())
    # nothing removed: the subtract row is the accuracy of the DAG's Δw composition
    model, _, backbone_record = load_tuned_model(results_of(study) / "pretrain", results_of(study) / "compose/taft-1/n3_s0/soup.safetensors")
    test = SampleStore(results_of(study) / "prepare/samples.parquet").split("target", "test")
    with torch.no_grad():
        logits = model.eval()(to_model_input(test.images, backbone_record["mean"], backbone_record["std"]))
    r0 = drop[(drop.metric == "accuracy") & (drop.model == "subtract") & drop.variant.str.contains('"removed_shards": 0')]
    assert r0.value.item() == pytest.approx(classification_metrics(logits, test.labels)["accuracy"], abs=1e-9)
    affected = retrain[retrain.metric == "affected_shards"].value
    assert affected.min() >= 1 and affected.max() <= 3


def test_audit_after_retrain_shard_finds_no_forgotten_id(study):
    for composed in sorted((results_of(study) / "unlearn_retrain").glob("*/n3_s0/*/composed.safetensors")):
        _, record = load_model(composed)
        forgotten = record["forgotten_ids"]
        result = audit_model(composed, forgotten)
        assert result.clean, (composed, result.hits, result.stale)
        assert len(result.checked) == 1 + 3  # the composition and its 3 shard models
        # the DAG's shard models before forgetting did see them, exactly the retrained shards
        before = sorted((results_of(study) / "train" / record["method"] / "n3_s0").glob("shard*.safetensors"))
        hits = [hit for p in before for hit in audit_model(p, forgotten).hits]
        retrained = {c["shard_id"] for c in record["components"] if c["retrained"]}
        assert {int(re.search(r"shard(\d+)", p).group(1)) for p, _ in hits} == retrained
        assert sorted(i for _, ids in hits for i in ids) == forgotten
    # the DAG's own composition before forgetting names the shards that saw the ids
    forgotten = load_model(results_of(study) / "unlearn_retrain/taft-1/n3_s0/f0.3_r0/composed.safetensors")[1]["forgotten_ids"]
    taft_soup = results_of(study) / "compose/taft-1/n3_s0/soup.safetensors"
    hit_paths = [p for p, _ in audit_model(taft_soup, forgotten).hits]
    assert hit_paths and all("results/tiny/train/taft-1/n3_s0/shard" in p for p in hit_paths)


def test_audit_cli_exit_codes_on_trained_subtracted_and_paragon_models(study, tmp_path):
    cli = [sys.executable, "-m", "pipeline_src.store.audit"]
    run = lambda *a: subprocess.run([*cli, *map(str, a)], capture_output=True, text=True, cwd=study,  # noqa: E731
                                    env={**os.environ, "PYTHONPATH": str(REPO)})
    _, shard1 = load_model(results_of(study) / "train/taft-1/n3_s0/shard1.safetensors")
    (tmp_path / "ids.txt").write_text("\n".join(shard1["sample_ids"][:2]) + "\n")
    trained = run("results/tiny/train/taft-1/n3_s0/shard1.safetensors", tmp_path / "ids.txt")
    assert trained.returncode == 1 and "shard1.safetensors" in trained.stdout
    assert run("results/tiny/train/taft-1/n3_s0/shard0.safetensors", tmp_path / "ids.txt").returncode == 0
    subtracted = next((results_of(study) / "unlearn_drop/taft-1/n3_s0").glob("r1_*.safetensors"))
    _, rec = load_model(subtracted)
    (removed,) = [c["shard_id"] for c in rec["removed_components"]]
    _, removed_rec = load_model(results_of(study) / f"train/taft-1/n3_s0/shard{removed}.safetensors")
    assert run(subtracted, *removed_rec["sample_ids"][:3]).returncode == 0
    kept = rec["components"][0]["path"]
    _, kept_rec = load_model(study / kept)
    out = run(subtracted, kept_rec["sample_ids"][0])
    assert out.returncode == 1 and Path(kept).name in out.stdout
    paragon = next((results_of(study) / "unlearn_paragon/taft-1/s0").glob("*.safetensors"))
    assert run(paragon, *load_model(paragon)[1]["forgotten_ids"]).returncode == 0


def test_reports_draw_both_figures(study, tmp_path):
    from pipeline_src.reports.unlearning import REPORTS

    con = duckdb.connect()
    con.sql(f"CREATE VIEW metrics AS SELECT * FROM read_parquet('{results_of(study)}/metrics/**/*.parquet', union_by_name=true)")
    paths = [p for fn in REPORTS.values() for p in fn(con, tmp_path)]
    names = {p.name for p in paths}
    assert {"unlearning_drop.png", "unlearning_retrain.png", "unlearning_retrain.csv"} <= names
    table = duckdb.read_csv(str(tmp_path / "unlearning_retrain.csv")).df()
    assert {"paragon", "paragon-nonlinear", "retrain-shard"} <= set(table.strategy)
    # the speed-up against each paragon is that paragon's time over the strategy's
    for _, row in table[table.strategy == "retrain-shard"].iterrows():
        at = table[(table.method == row.method) & (table.fraction == row.fraction)].set_index("strategy")
        own = at.loc["paragon", "unlearn_time_s"]
        nl = at.loc["paragon-nonlinear", "unlearn_time_s"] if row.method == "taft-1" else own
        assert row.speedup_vs_paragon == pytest.approx(own / row.unlearn_time_s)
        assert row.speedup_vs_nonlinear_paragon == pytest.approx(nl / row.unlearn_time_s)


def _request(study: Path, ids: list[str], name: str) -> Path:
    (study / f"{name}.txt").write_text("\n".join(ids) + "\n")
    cfg = _config()
    cfg["forget"]["requests"] = str(study / f"{name}.txt")
    (study / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return study / f"{name}.yaml"


def _manifest(study: Path, n: int) -> pa.Table:
    """The whole N-way split: the shards' manifests (rule forget_manifest) together."""
    return pa.concat_tables([pq.read_table(results_of(study) / f"split/n{n}_s0/shard{i}.parquet") for i in range(n)])


def _mtimes(study: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in results_of(study).rglob("*") if p.is_file()}


def test_bad_requests_fail_before_any_change(study):
    samples = pq.read_table(results_of(study) / "prepare/samples.parquet").to_pydict()
    test_id = next(i for i, t, s in zip(samples["sample_id"], samples["task"], samples["split"])
                   if t == "target" and s == "test")
    train_id = shard_ids(_manifest(study, 2), 0)[0]
    before = _mtimes(study)
    for ids, named in (([train_id, test_id], test_id), ([train_id, train_id], train_id), (["digits/5/99999"], "digits/5/99999")):
        proc = snakemake(study, *TARGETS, "--cores", "2", "--configfile", str(_request(study, ids, "bad")), check=False)
        assert proc.returncode != 0
        assert re.search(rf"forget\.requests.*{re.escape(named)}", proc.stdout + proc.stderr)
    assert _mtimes(study) == before


def test_dry_run_after_a_forget_request_plans_only_affected_shards(study):
    n2 = _manifest(study, 2)
    ids = shard_ids(n2, 1)[:2]  # both in shard 1 of n2_s0
    n3 = _manifest(study, 3)
    hit3 = set(forgotten_by_shard(n3, ids))
    config = _request(study, ids, "forget")
    outputs = " ".join(planned_outputs(snakemake(study, *TARGETS, "-n", "--cores", "2", "--configfile", str(config))))
    manifests = set(re.findall(r"results/tiny/split/(n\d+_s0/shard\d+)\.parquet", outputs))
    assert manifests == {"n1_s0/shard0", "n2_s0/shard1"} | {f"n3_s0/shard{s}" for s in hit3}
    for m in ("taft-1", "nlft-1"):
        assert f"results/tiny/train/{m}/n2_s0/shard1.safetensors" in outputs
        assert f"results/tiny/compose/{m}/n2_s0/soup.safetensors" in outputs
        assert f"results/tiny/metrics/evaluate/{m}/n2_s0/shards.parquet" in outputs  # the method's N shards: one job
    for s in set(range(3)) - hit3:
        assert f"n3_s0/shard{s}.safetensors" not in outputs and f"n3_s0/shard{s}.parquet" not in outputs
    assert not re.search(r"n2_s0/shard0|results/tiny/prepare/|results/tiny/pretrain/|results/tiny/features/|manifest\.parquet", outputs)
