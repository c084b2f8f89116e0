"""Converted rules (`plan/step_settings.py`) on the tiny study: a step handed its settings and no
config writes what the study's job wrote, and Snakemake reruns exactly the jobs whose settings a
config change touches (the params trigger), not the ones that merely run with it."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import yaml

from pipeline_src.plan.config import validate_config
from pipeline_src.runner.step_args import NoConfig
from tests.conftest import planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study
from tests.steps.helpers import step_args

pytestmark = pytest.mark.e2e
RUN = {"method": "taft-1", "shards": "2", "seed": "0"}


@pytest.fixture(scope="module")
def cfg(tiny_study) -> dict:
    return validate_config(yaml.safe_load((tiny_study / "config.yaml").read_text()), count_samples=False)


def shard_models(study: Path) -> list[str]:
    return [str(results_of(study) / "train" / "taft-1" / "n2_s0" / f"shard{i}.safetensors") for i in range(2)]


def with_models(args, models: list[str]):
    args.input._names["models"] = models  # a list input, as the rule's
    args.input[:] = [*args.input, *models]
    return args


def test_compose_on_its_settings_alone_writes_the_studys_soup(tiny_study, cfg, tmp_path):
    from pipeline_src.steps import compose

    out = tmp_path / "soup.safetensors"
    args = with_models(step_args(cfg, outputs={"model": out, "record": out.with_suffix(".json")}, wildcards=RUN,
                                 rule="compose"), shard_models(tiny_study))
    assert isinstance(args.config, NoConfig)  # any read of the config would raise
    compose.main(args)
    soup = results_of(tiny_study) / "compose" / "taft-1" / "n2_s0" / "soup.safetensors"
    assert out.read_bytes() == soup.read_bytes()


def test_the_ensemble_on_its_settings_alone_scores_as_the_studys(tiny_study, cfg, tmp_path):
    from pipeline_src.steps import evaluate

    results = results_of(tiny_study)
    out = tmp_path / "ensemble.parquet"
    args = step_args(cfg, inputs={"samples": results / "prepare" / "samples.parquet",
                                  "backbone": results / "pretrain" / "model.safetensors"},
                     outputs={"metrics": out}, params={"model": "ensemble"}, wildcards=RUN, rule="evaluate_ensemble")
    evaluate.main(with_models(args, shard_models(tiny_study)))
    query = "SELECT metric, value FROM read_parquet('{}') ORDER BY metric"
    study = results / "metrics" / "evaluate" / "taft-1" / "n2_s0" / "ensemble.parquet"
    assert duckdb.sql(query.format(out)).fetchall() == duckdb.sql(query.format(study)).fetchall()


def study_metrics(path: Path) -> list[tuple]:
    """A metrics file's (model, variant, metric, value) rows but the timings (which vary run to run)."""
    return duckdb.sql(f"""SELECT model, variant, metric, value FROM read_parquet('{path}')
        WHERE metric NOT LIKE '%time%' ORDER BY ALL""").fetchall()


def unlearning_args(study: Path, cfg: dict, rule: str, wildcards: dict, out: Path):
    """A study job's arguments as the forget.smk rule gives them (models for the drop and retrain
    rules, the full-data model for the paragons), its outputs under `out`."""
    results, method = results_of(study), wildcards["method"]
    inputs = {"samples": results / "prepare" / "samples.parquet", "backbone": results / "pretrain" / "model.safetensors"}
    params = {}
    if rule == "unlearn_drop":
        params = {"removed_shards": cfg["forget"]["study"]["removed_shards"],
                  "requests": cfg["forget"]["study"]["requests_per_point"]}
        if method.startswith("taft"):
            inputs["composed"] = results / "compose" / method / "n3_s0" / "soup.safetensors"
    elif rule.startswith("unlearn_paragon"):
        inputs["full"] = results / "train" / method / "n1_s0" / "shard0.safetensors"
        params = {"nonlinear": rule.endswith("nonlinear")}
    outputs = {"metrics": out / "metrics.parquet", "models": out / "models", "model": out / "model.safetensors"}
    args = step_args(cfg, inputs=inputs, outputs=outputs, params=params, wildcards=wildcards, rule=rule)
    if rule in ("unlearn_drop", "unlearn_retrain"):
        with_models(args, [str(results / "train" / method / "n3_s0" / f"shard{i}.safetensors") for i in range(3)])
    return args


STUDY_JOBS = [  # (rule, wildcards, the study's metrics file of that job under results/metrics/)
    ("unlearn_drop", {"method": "nlft-1", "shards": "3", "seed": "0"}, "unlearn_drop/nlft-1/n3_s0.parquet"),
    ("unlearn_drop", {"method": "taft-1", "shards": "3", "seed": "0"}, "unlearn_drop/taft-1/n3_s0.parquet"),
    ("unlearn_retrain", {"method": "nlft-1", "shards": "3", "seed": "0", "fraction": "0.01", "request": "0"},
     "unlearn_retrain/nlft-1/n3_s0/f0.01_r0.parquet"),
    ("unlearn_paragon_nonlinear", {"method": "taft-1", "seed": "0", "fraction": "0.01", "request": "0"},
     "unlearn_paragon_nonlinear/taft-1/s0/f0.01_r0.parquet"),
]


@pytest.mark.parametrize("rule, wildcards, metrics", STUDY_JOBS, ids=[f"{r}-{w['method']}" for r, w, _ in STUDY_JOBS])
def test_an_unlearning_step_on_its_settings_alone_scores_as_the_studys(tiny_study, cfg, tmp_path, rule, wildcards,
                                                                        metrics):
    """The study steps (steps/forget/) read their settings through `StepArgs.job_config`: handed
    those and no config, a job writes the study's rows (the same training, weights and request).
    The settings are what the job reads: a wrong or missing one changes the rows or raises."""
    from pipeline_src.steps import step_of_rule

    study_file = results_of(tiny_study) / "metrics" / metrics
    assert study_file.exists(), study_file
    args = unlearning_args(tiny_study, cfg, rule, wildcards, tmp_path)
    assert isinstance(args.config, NoConfig)
    __import__(f"pipeline_src.steps.{step_of_rule(rule)}", fromlist=["main"]).main(args)
    ours, theirs = study_metrics(args.output.metrics), study_metrics(study_file)
    assert [r[:3] for r in ours] == [r[:3] for r in theirs]
    # training in this process rounds as float32 does, not as the job's process did (a loss differed by 2e-6)
    assert [r[3] for r in ours] == pytest.approx([r[3] for r in theirs], rel=1e-4)


def test_a_changed_setting_reruns_the_jobs_that_read_it_only(tiny_study, tmp_path):
    """compose_weights is read by compose, the ensembles, the forget study's sisa-drop and its
    retrain-shard recomposition: those rerun (and their dependants: the soups' evaluations, the taft
    drop that subtracts from a soup, the report); train.num_workers is run-only: the training
    jobs that read it do not rerun, nor the paragons, which read the train block."""
    workdir = copy_study(tiny_study, tmp_path / "study", parts=None)
    cfg = yaml.safe_load((tiny_study / "config.yaml").read_text())
    cfg["compose_weights"] = "size"
    cfg["train"]["num_workers"] = 2
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    planned = planned_outputs(snakemake(workdir, "-n", "--cores", "2"))
    folders = {"/".join(p.split("/")[2:4 if p.startswith("results/tiny/metrics/") else 3])
               for out in planned for p in out.split(", ")}
    assert folders == {"compose", "metrics/evaluate", "unlearn_drop", "metrics/unlearn_drop", "unlearn_retrain",
                       "metrics/unlearn_retrain", "report"}
    drops = {out.split(", ")[0] for out in planned if out.startswith("results/tiny/metrics/unlearn_drop/")}
    assert drops == {f"results/tiny/metrics/unlearn_drop/{m}/n3_s0.parquet" for m in ("taft-1", "nlft-1")}
    retrains = [out for out in planned if out.startswith("results/tiny/metrics/unlearn_retrain/")]
    assert len(retrains) == 2 * 2  # both methods, both fractions
    soups = {out.split(", ")[0] for out in planned if out.startswith("results/tiny/compose/")}
    # each method's N = 2 soup, and the forget study's taft soup it subtracts from (N = 3)
    assert soups == {f"results/tiny/compose/{m}/n2_s0/soup.safetensors" for m in cfg["methods"]} | {
        "results/tiny/compose/taft-1/n3_s0/soup.safetensors"}
    ensembles = [out for out in planned if out.endswith("/ensemble.parquet")]
    assert len(ensembles) == len(cfg["methods"])
