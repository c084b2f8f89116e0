"""A real Snakemake run of the tiny `.test` study, then dry runs against it."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import torch
import yaml

from pipeline_src.plan.config import validate_config
from tests.conftest import REPO, planned_outputs, results_of, snakemake

pytestmark = pytest.mark.e2e



@pytest.fixture(scope="module")
def study(tiny_study) -> Path:
    """The session's tiny study (tests/e2e/conftest.py): run once, GPU jobs on a fake 2-GPU machine."""
    return tiny_study


def test_each_gpu_job_ran_on_a_device_slot_of_its_own(study):
    # Snakemake sets no CUDA_VISIBLE_DEVICES for local jobs; the launcher gives each GPU job one
    # of the (fake) 2 devices. Concurrency of the slots themselves: tests/runner/test_gpu_slots.py.
    logs = sorted((results_of(study) / "logs" / "train").rglob("*.log"))
    assert logs
    for log in logs:
        assert re.search(r"^\[launch\] CUDA_VISIBLE_DEVICES=[01]$", log.read_text(), re.M), log
    assert sorted(p.name for p in (study / "gpu-locks").iterdir()) == ["gpu0.lock", "gpu1.lock"]


def test_study_runs_to_a_report_with_every_model(study):
    cfg = yaml.safe_load((study / "config.yaml").read_text())
    for name in ("accuracy.md", "accuracy.csv", "accuracy.png"):
        assert (results_of(study) / "report" / name).stat().st_size > 0
    con = duckdb.connect()
    rows = con.sql(f"""SELECT method, shards, model, shard_id, value FROM
        read_parquet('{results_of(study)}/metrics/evaluate/**/*.parquet', union_by_name=true)
        WHERE metric = 'accuracy'""").fetchall()
    # per method (the search's grid points are validated only, their method tested at the selected
    # point): the full-data model, 2 shard models, their soup and their ensemble
    methods = validate_config(cfg, count_samples=False)["methods"]
    assert len(methods) > len(cfg["methods"]) and len(rows) == len(cfg["methods"]) * (1 + 2 + 2)
    assert all(0.0 <= r[-1] <= 1.0 for r in rows)
    # every model records its sample ids, and shard models partition the training split
    records = con.sql(f"SELECT shard_id, sample_ids FROM read_json_auto('{results_of(study)}/train/fc/n2_s0/*.json')").fetchall()
    ids = [i for _, s in records for i in s]
    assert len(ids) == len(set(ids)) > 0


def test_per_image_records_reproduce_the_test_accuracy(study):
    """Every per-image file (store/per_image.py: the evaluate, unlearning and fusion steps') gives
    back its metrics file's test accuracy per model; each names the test split's images once per
    model, nothing else."""
    from pipeline_src.store.results_db import connect

    con = connect(results_of(study))
    keys = "method, model, shards, coalesce(shard_id, -1), seed, coalesce(variant, '')"
    acc = dict(con.sql(f"SELECT ({keys}), avg(correct::DOUBLE) FROM per_image GROUP BY ALL").fetchall())
    root = results_of(study) / "metrics"
    written = ",".join(f"'{root}/{step}/**/*.parquet'" for step in ("evaluate", "unlearn_drop", "unlearn_retrain",
                                                                       "unlearn_paragon", "unlearn_paragon_nonlinear", "fuse"))
    want = dict(con.sql(f"SELECT ({keys}), value FROM read_parquet([{written}], union_by_name=true) "
                        "WHERE metric = 'accuracy' AND split = 'test'").fetchall())
    assert acc and set(acc) == set(want)
    models = {k[1] for k in want}
    assert {"shard", "soup", "ensemble", "subtract", "sisa-drop", "retrain-shard", "paragon", "fusion-soup"} <= models
    for key, value in want.items():  # a mean of 0/1 in float64 against the step's float64 mean
        assert abs(acc[key] - value) < 1e-12, key
    test_ids = {r[0] for r in con.sql("SELECT sample_id FROM samples WHERE task = 'target' AND split = 'test'").fetchall()}
    assert {r[0] for r in con.sql("SELECT DISTINCT sample_id FROM per_image").fetchall()} == test_ids
    assert con.execute(f"SELECT max(n) FROM (SELECT count(*) AS n FROM per_image GROUP BY {keys}, sample_id)").fetchone()[0] == 1


def test_report_has_the_claims_table_beside_the_study_reports(study):
    """One row per claim the tiny study can test or not; figures and verdicts agree with the
    Table 1, Table 2, unlearning and fusion reports of the same run (reports/claims.py)."""
    out = results_of(study) / "report"
    assert "- claims: [claims.md](claims.md)" in (out / "index.md").read_text()
    assert (out / "claims.md").read_text().startswith("# Claims") and "experiment `tiny`" in (out / "claims.md").read_text()
    claims = {r["claim"]: r for r in duckdb.read_csv(str(out / "claims.csv")).df().fillna("").to_dict("records")}
    fusion = "Matching before merging raises the soup's accuracy"
    cost = "Unlearning cost: retrain-shard ≈ N× cheaper than the paragon"
    assert list(claims) == [
        "Pretraining is worth it: fine-tuned models above every no-pretraining reference",
        "TAFT-1 within 1 pt of NLFT-1", "TAFT composition (Δw sum) ≥ non-linear soup, N = 2",
        "TAFT subtract ≥ SISA drop, N = 3", "DP TAFT ≥ DP NLFT", f"{fusion}: last, N = 2, random_reinit",
        f"{fusion}: nlft-1, N = 2, random_reinit", "LAST ≥ FC at ≤ 25 % of full fine-tuning's memory",
        f"{cost}: nlft-1, N = 3", f"{cost}: taft-1, N = 3"]  # config order (the fixture's YAML sorts it)
    verdict = {name: c["holds"] for name, c in claims.items()}
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    t1 = dict(duckdb.sql(f"SELECT method, accuracy FROM '{out}/table1_methods.csv'").fetchall())
    # Tables 1 and 2, Figure 1 and fusion: decided by the paired bootstrap over the steps' per-image
    # records; a decided row agrees with the point gap's sign
    for name in ("TAFT-1 within 1 pt of NLFT-1", "TAFT composition (Δw sum) ≥ non-linear soup, N = 2",
                 "TAFT subtract ≥ SISA drop, N = 3", f"{fusion}: last, N = 2, random_reinit",
                 f"{fusion}: nlft-1, N = 2, random_reinit"):
        assert "paired bootstrap over 1 seed and" in claims[name]["paired test: estimate [95 % interval]"], name
        assert claims[name]["verdict vs the paper's row"] in ("agrees", "disagrees", "undecided"), name
    assert {claims[f"{cost}: {m}, N = 3"]["verdict vs the paper's row"] for m in ("nlft-1", "taft-1")} <= {
        "by construction", "n/a"}
    assert verdict["TAFT-1 within 1 pt of NLFT-1"] in ("undecided", yes(t1["taft-1"] >= t1["nlft-1"] - 0.01))
    assert claims["TAFT-1 within 1 pt of NLFT-1"]["this study's figure"].startswith(
        f"taft-1 {100 * t1['taft-1']:.1f} %, nlft-1 {100 * t1['nlft-1']:.1f} %")
    t2 = dict(duckdb.sql(f"SELECT composed, \"N=2\" FROM '{out}/table2_composition.csv'").fetchall())
    assert verdict["TAFT composition (Δw sum) ≥ non-linear soup, N = 2"] in ("undecided", yes(
        t2["taft-1 (Δw sum)"] >= t2["nlft-1 (soup)"]))
    drop = dict(duckdb.sql(f"SELECT strategy, accuracy FROM '{out}/unlearning_drop.csv' WHERE removed_shards = 1").fetchall())
    assert verdict["TAFT subtract ≥ SISA drop, N = 3"] in ("undecided", yes(drop["subtract"] >= drop["sisa-drop"]))
    soups = dict(duckdb.sql(f"SELECT method, \"rotation-scaling\" > none FROM '{out}/fusion_table2.csv' "
                            "WHERE fusion = 'soup'").fetchall())
    assert verdict[f"{fusion}: nlft-1, N = 2, random_reinit"] in ("undecided", yes(soups["nlft-1"]))
    assert verdict[f"{fusion}: last, N = 2, random_reinit"] in ("undecided", yes(soups["last"]))
    # What the tiny study does not run: privacy, a full method; and every forget request of
    # the study touched more than one of its 3 shards (checked in the metrics).
    assert verdict["DP TAFT ≥ DP NLFT"] == verdict["LAST ≥ FC at ≤ 25 % of full fine-tuning's memory"] == "n/a"
    assert verdict["Pretraining is worth it: fine-tuned models above every no-pretraining reference"] == "n/a"
    fewest = duckdb.sql(f"""SELECT min(value) FROM read_parquet('{results_of(study)}/metrics/unlearn_retrain/**/*.parquet')
                            WHERE metric = 'affected_shards'""").fetchall()[0][0]
    assert fewest > 1 and verdict[f"{cost}: taft-1, N = 3"] == verdict[f"{cost}: nlft-1, N = 3"] == "n/a"
    # the training memory the LAST row compares: each train record's peak (CPU: the job's max RSS,
    # which torch alone puts above 100 MB)
    peaks = duckdb.sql(f"SELECT peak_mem_mb FROM read_json_auto('{results_of(study)}/train/*/n1_s0/shard0.json')").fetchall()
    trained = validate_config(yaml.safe_load((study / "config.yaml").read_text()), count_samples=False)["methods"]
    assert len(peaks) == len(trained) and all(p > 100 for (p,) in peaks)  # the search's grid points too


def test_report_has_the_per_rule_efficiency_table(study):
    """Issue 25: the report's efficiency table, from the jobs' benchmark files and own counters."""
    report = results_of(study) / "report"
    assert "(efficiency.md)" in (report / "index.md").read_text()
    df = duckdb.read_csv(str(report / "efficiency.csv")).df().set_index("rule")
    # every job's benchmark file but the report's own, written once the report job has ended
    jobs = [p for p in (results_of(study) / "logs").rglob("*.bench.tsv") if p.parent.name != "report"]
    assert df.jobs.sum() == len(jobs) and {"prepare", "pretrain", "train", "evaluate_shards"} <= set(df.index)
    for rule in ("pretrain", "features", "train", "train_vectorized_taft-1-vec_n2_s0", "evaluate_shards",
                 "evaluate_soup", "last_grid"):
        r = df.loc[rule]
        assert r.images > 0 and r.images_per_s > 0 and r.gflop_per_image > 0 and r.gflop_per_s > 0, rule
        assert 0 < r.peak_pct and r.peak_gflop_per_s > 0, rule
        assert 0 < r.outside_step_s < r.wall_s, rule  # the fixed cost of its jobs: start, imports, load
    # one evaluation job per method, N and seed counts each test image once (one prefix pass for its shard models)
    test_images = duckdb.sql(f"""SELECT any_value(num_samples) FROM read_parquet('{results_of(study)}/metrics/evaluate/**/*.parquet')
                                 WHERE model = 'ensemble'""").fetchall()[0][0]
    cfg = yaml.safe_load((study / "config.yaml").read_text())
    methods = cfg["methods"]  # the search's grid points are validated, not tested
    assert df.loc["evaluate_shards"].jobs == len(methods) * len(cfg["shards"]) * len(cfg["seeds"])
    assert df.loc["evaluate_shards"].images == test_images * df.loc["evaluate_shards"].jobs
    assert abs(df.wall_share_pct.sum() - 100) < 1e-6
    # every job's exact peak, from the fork server's wait4: a child holds the server's torch pages
    assert not [j for j in jobs if not j.with_name(j.name.removesuffix(".bench.tsv") + ".rss.json").exists()]
    assert (df.peak_rss_mb > 100).all(), df.peak_rss_mb


def test_weight_distance_rows_and_fig4_report(study):
    """TAFT Fig. 4: every single model's distance from its start; the taft Δw sum is no farther
    than its shards on average (triangle inequality, uniform weights), and the report tabulates it."""
    con = duckdb.connect()
    dist = dict(con.sql(f"""SELECT model, avg(value) FROM
        read_parquet('{results_of(study)}/metrics/evaluate/taft-1/n2_s0/*.parquet', union_by_name=true)
        WHERE metric = 'weight_distance' GROUP BY model""").fetchall())
    assert set(dist) == {"shard", "soup"} and 0 < dist["soup"] <= dist["shard"] + 1e-9
    table = duckdb.read_csv(str(results_of(study) / "report" / "fig4_weight_distance.csv")).df()
    assert set(table.model) >= {"full-data", "shard-mean", "soup"} and (table.weight_distance > 0).all()


def test_taft_composition_equals_the_ensemble_of_its_shards(study):
    # The tangent model is linear in Δw, so the composed model IS the ensemble: equal metrics.
    con = duckdb.connect()
    acc = dict(con.sql(f"""SELECT model || '/' || metric, value FROM
        read_parquet('{results_of(study)}/metrics/evaluate/taft-1/n2_s0/*.parquet')""").fetchall())
    assert acc["soup/accuracy"] == acc["ensemble/accuracy"]
    assert abs(acc["soup/loss"] - acc["ensemble/loss"]) < 1e-5


def test_vectorized_shard_training_gives_the_per_shard_models(study):
    from safetensors.torch import load_file

    for i in range(2):  # taft-1-vec has the settings of this grid point, trained one shard a job
        separate = load_file(results_of(study) / f"train/taft-1_lr1e-3_ptF_clsF/n2_s0/shard{i}.safetensors")
        vectorized = load_file(results_of(study) / f"train/taft-1-vec/n2_s0/shard{i}.safetensors")
        assert separate.keys() == vectorized.keys()
        for k in separate:
            a, b = separate[k], vectorized[k]
            if k.endswith("attn.qkv.delta.bias"):
                # The key bias adds q·b_k to every score of a query row, which softmax ignores:
                # its true gradient is 0, so Adam steps on float rounding noise. Compare q and v.
                d = a.numel() // 3
                a, b = torch.cat([a[:d], a[2 * d:]]), torch.cat([b[:d], b[2 * d:]])
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), k


def test_nothing_to_do_after_the_run(study):
    proc = snakemake(study, "-n", "--cores", "2")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_a_dry_run_of_the_finished_study_imports_no_pandas(study):
    # Snakemake's params check imported it to look for DataFrame params (plan/params_serializer.py):
    # 0.3 CPU-s of every dry run with outputs on disk. The Slurm executor plugin imports it anyway.
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None:
        pytest.skip("the Slurm executor plugin imports pandas at Snakemake's start")
    code = ("import sys\nfrom snakemake.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('pandas' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, "-n", "-q", "rules", "-s", str(REPO / "Snakefile"),
                           "--directory", str(study)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr


def test_changing_the_shard_count_reruns_only_its_dependants(study, tmp_path):
    cfg = yaml.safe_load((study / "config.yaml").read_text())
    cfg["shards"] = [1, 3]
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(study, "-n", "--cores", "2", "--configfile", str(tmp_path / "changed.yaml"))
    planned = planned_outputs(proc)
    outputs = " ".join(planned)
    assert "n3_s0" in outputs and re.search(r"(^| )results/tiny/report( |$)", outputs)
    # the search runs at every N (search.shards empty): N = 3 joins fc's and taft-1's selections, so
    # they rerun, and so does what trains at them at every N (plan/selected_point.py); nothing else
    searched = re.compile(r"results/tiny/(select|(train|compose|metrics/evaluate|unlearn_\w+|metrics/unlearn_\w+)/(fc|taft-1)/)")
    others = " ".join(o for o in planned if not searched.search(o))
    assert not re.search(r"n1_s0|n2_s0|results/tiny/prepare/|results/tiny/pretrain/", others), others


def test_invalid_config_fails_before_any_job(tmp_path):
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["methods"]["nlft-1"]["k"] = "one"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(tmp_path, "--cores", "1", check=False)
    assert proc.returncode != 0
    assert "methods.nlft-1.k" in proc.stdout + proc.stderr
    assert not results_of(tmp_path).exists()


def test_query_command_answers_sql_over_all_views(study):
    run = lambda *a: subprocess.run([sys.executable, "-m", "pipeline_src.store.query", "--results", str(results_of(study)), *a],  # noqa: E731
                                    capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    views = run("--views")
    assert views.returncode == 0
    for name in ("metrics", "models", "manifests", "samples", "jobs"):
        assert f"{name}:" in views.stdout
    out = run("--format", "csv", "SELECT method, count(*) AS n FROM models WHERE kind = 'trained' GROUP BY method ORDER BY method")
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "method,n"
    assert "fc,3" in out.stdout  # full-data model + 2 shard models
    bad = run("SELECT * FROM no_such_view")
    assert bad.returncode == 1 and "no_such_view" in bad.stderr
