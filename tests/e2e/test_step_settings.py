"""Converted rules (`plan/step_settings.py`) on the tiny study: a step handed its settings and no
config writes what the study's job wrote, and Snakemake reruns exactly the jobs whose settings a
config change touches (the params trigger), not the ones that merely run with it."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import yaml

from pipeline_src.plan.config import validate_config
from pipeline_src.plan.selected_point import selected_at, selection_base, selection_file
from pipeline_src.runner.step_args import NoConfig
from tests.conftest import planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study
from tests.steps.helpers import step_args

pytestmark = pytest.mark.e2e
RUN = {"method": "taft-1", "shards": "2", "seed": "0"}


@pytest.fixture(scope="module")
def cfg(tiny_study) -> dict:
    return validate_config(yaml.safe_load((tiny_study / "config.yaml").read_text()), count_samples=False)


def shard_models(study: Path, method: str = "taft-1") -> list[str]:
    return [str(results_of(study) / "train" / method / "n2_s0" / f"shard{i}.safetensors") for i in range(2)]


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


def evaluate_shards_args(tiny_study: Path, cfg: dict, out: Path, models: list[str], ensemble: bool,
                         method: str = "taft-1"):
    results = results_of(tiny_study)
    args = step_args(cfg, inputs={"samples": results / "prepare" / "samples.parquet",
                                  "backbone": results / "pretrain" / "model.safetensors"},
                     outputs={"metrics": out}, params={"model": "shards", "ensemble": ensemble},
                     wildcards={**RUN, "method": method}, rule="evaluate_shards")
    return with_models(args, models)


def test_the_shard_evaluation_on_its_settings_alone_scores_as_the_studys(tiny_study, cfg, tmp_path):
    from pipeline_src.steps import evaluate

    out = tmp_path / "shards.parquet"
    evaluate.main(evaluate_shards_args(tiny_study, cfg, out, shard_models(tiny_study), ensemble=True))
    query = "SELECT model, shard_id, metric, value FROM read_parquet('{}') ORDER BY ALL"
    study = results_of(tiny_study) / "metrics" / "evaluate" / "taft-1" / "n2_s0" / "shards.parquet"
    assert duckdb.sql(query.format(out)).fetchall() == duckdb.sql(query.format(study)).fetchall()


@pytest.mark.parametrize("method", ["fc", "nlft-1", "taft-1", "last"])
def test_shard_models_evaluated_together_score_as_each_alone(tiny_study, cfg, tmp_path, method):
    """The batched job (N shard models, one prefix pass per batch, one copy of the frozen backbone)
    writes the rows N per-shard jobs wrote: each shard model evaluated alone, by the same step
    given only its own file; the ensemble's rows as the ensemble-only evaluation gives them."""
    from pipeline_src.steps import evaluate

    models = shard_models(tiny_study, method)
    together = tmp_path / "together.parquet"
    evaluate.main(evaluate_shards_args(tiny_study, cfg, together, models, ensemble=True, method=method))
    alone = []
    for i, model in enumerate(models):
        evaluate.main(evaluate_shards_args(tiny_study, cfg, tmp_path / f"alone{i}.parquet", [model], ensemble=False,
                                           method=method))
        alone.append(tmp_path / f"alone{i}.parquet")
    ens = evaluate_shards_args(tiny_study, cfg, tmp_path / "ensemble.parquet", models, ensemble=False, method=method)
    ens.params["model"] = "ensemble"  # the ensemble's rows alone
    evaluate.main(ens)
    cols = "model, variant, shards, shard_id, seed, split, metric, num_samples, experiment, dataset, method, kind"
    query = f"SELECT {cols}, value FROM read_parquet({{}}) ORDER BY ALL"
    got = duckdb.sql(query.format(f"'{together}'")).fetchall()
    want = duckdb.sql(query.format([str(p) for p in [*alone, tmp_path / "ensemble.parquet"]])).fetchall()
    assert [r[:-1] for r in got] == [r[:-1] for r in want]
    assert {r[0] for r in got} == {"shard", "ensemble"} and {r[3] for r in got} == {0, 1, None}
    assert [r[-1] for r in got] == pytest.approx([r[-1] for r in want], rel=1e-6, abs=1e-9)


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
    # the method's searched point, as the rule's `selected_at` param and `selection` input give it
    spec = selected_at(cfg, method, 1 if rule.startswith("unlearn_paragon") else int(wildcards["shards"]))
    if spec is not None:
        inputs["selection"], params["selected_at"] = selection_file(str(results), spec["base"]), spec
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
    drop that subtracts from a soup, the report). The search validates soups, so its `select` reruns,
    and with it what trains at the selected point: the searched methods' training and paragons, no
    other method's. train.num_workers is run-only: no job reruns for it alone."""
    workdir = copy_study(tiny_study, tmp_path / "study", parts=None)
    cfg = yaml.safe_load((tiny_study / "config.yaml").read_text())
    cfg["compose_weights"] = "size"
    cfg["train"]["num_workers"] = 2
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    planned = planned_outputs(snakemake(workdir, "-n", "--cores", "2"))
    folders = {"/".join(p.split("/")[2:4 if p.startswith(("results/tiny/metrics/", "results/tiny/per_image/")) else 3])
               for out in planned for p in out.split(", ")}
    # and the search's: its candidates' soups are validated again, then selected again, and the jobs
    # that read the selection (train, the paragons) run again at its point
    assert folders == {"compose", "metrics/evaluate", "unlearn_drop", "metrics/unlearn_drop", "unlearn_retrain",
                       "metrics/unlearn_retrain", "validate", "select", "report", "train", "unlearn_paragon",
                       "metrics/unlearn_paragon", "unlearn_paragon_nonlinear", "metrics/unlearn_paragon_nonlinear",
                       "per_image/evaluate", "per_image/unlearn_drop", "per_image/unlearn_retrain",
                       "per_image/unlearn_paragon", "per_image/unlearn_paragon_nonlinear"}
    trained = {p.split("/")[3] for out in planned for p in out.split(", ") if p.startswith("results/tiny/train/")}
    trained |= {p.split("/")[3] for out in planned for p in out.split(", ")
                if p.startswith("results/tiny/unlearn_paragon")}
    searched = {m for m in validate_config(cfg, count_samples=False)["methods"]
                if selection_base(validate_config(cfg, count_samples=False), m) == m}
    assert trained and trained <= searched, (trained, searched)
    drops = {out.split(", ")[0] for out in planned if out.startswith("results/tiny/metrics/unlearn_drop/")}
    assert drops == {f"results/tiny/metrics/unlearn_drop/{m}/n3_s0.parquet" for m in ("taft-1", "nlft-1")}
    retrains = [out for out in planned if out.startswith("results/tiny/metrics/unlearn_retrain/")]
    assert len(retrains) == 2 * 2  # both methods, both fractions
    soups = {out.split(", ")[0] for out in planned if out.startswith("results/tiny/compose/")}
    # each method's N = 2 soup; the forget study's taft soup that its drop subtracts from (N = 3) is
    # not listed: the drop trains at taft-1's selection, so a dry run shows it waiting on the `select`
    # checkpoint with its inputs unknown (a real run rebuilds that soup: the job's input after `select`)
    methods = validate_config(cfg, count_samples=False)["methods"]  # the search's grid points too
    assert soups == {f"results/tiny/compose/{m}/n2_s0/soup.safetensors" for m in methods}
    ensembles = [out for out in planned if out.startswith("results/tiny/metrics/evaluate/") and "/n2_s0/shards" in out]
    # the shard evaluations that hold an ensemble (N = 2), not N = 1, of the study's methods: the grid
    # points are validated only (`validate`), never tested
    assert len(ensembles) == len(cfg["methods"])
