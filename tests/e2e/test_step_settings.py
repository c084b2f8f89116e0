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
from tests.conftest import planned_outputs, snakemake
from tests.e2e.conftest import copy_study
from tests.steps.helpers import step_args

pytestmark = pytest.mark.e2e
RUN = {"method": "taft-1", "shards": "2", "seed": "0"}


@pytest.fixture(scope="module")
def cfg(tiny_study) -> dict:
    return validate_config(yaml.safe_load((tiny_study / "config.yaml").read_text()), count_samples=False)


def shard_models(study: Path) -> list[str]:
    return [str(study / "results" / "train" / "taft-1" / "n2_s0" / f"shard{i}.safetensors") for i in range(2)]


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
    soup = tiny_study / "results" / "compose" / "taft-1" / "n2_s0" / "soup.safetensors"
    assert out.read_bytes() == soup.read_bytes()


def test_the_ensemble_on_its_settings_alone_scores_as_the_studys(tiny_study, cfg, tmp_path):
    from pipeline_src.steps import evaluate

    results = tiny_study / "results"
    out = tmp_path / "ensemble.parquet"
    args = step_args(cfg, inputs={"samples": results / "prepare" / "samples.parquet",
                                  "backbone": results / "pretrain" / "model.safetensors"},
                     outputs={"metrics": out}, params={"model": "ensemble"}, wildcards=RUN, rule="evaluate_ensemble")
    evaluate.main(with_models(args, shard_models(tiny_study)))
    query = "SELECT metric, value FROM read_parquet('{}') ORDER BY metric"
    study = results / "metrics" / "evaluate" / "taft-1" / "n2_s0" / "ensemble.parquet"
    assert duckdb.sql(query.format(out)).fetchall() == duckdb.sql(query.format(study)).fetchall()


def test_a_changed_setting_reruns_the_jobs_that_read_it_only(tiny_study, tmp_path):
    """compose_weights is read by compose and the ensembles: those rerun (and their dependants:
    the soups' evaluations, the forget study's drop, the report); train.num_workers is run-only:
    the training jobs that read it do not rerun."""
    workdir = copy_study(tiny_study, tmp_path / "study", parts=None)
    cfg = yaml.safe_load((tiny_study / "config.yaml").read_text())
    cfg["compose_weights"] = "size"
    cfg["train"]["num_workers"] = 2
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    planned = planned_outputs(snakemake(workdir, "-n", "--cores", "2"))
    folders = {"/".join(p.split("/")[1:3 if p.startswith("results/metrics/") else 2])
               for out in planned for p in out.split(", ")}
    assert folders == {"compose", "metrics/evaluate", "unlearn_drop", "metrics/unlearn_drop", "report"}
    soups = {out.split(", ")[0] for out in planned if out.startswith("results/compose/")}
    # each method's N = 2 soup, and the forget study's taft soup it subtracts from (N = 3)
    assert soups == {f"results/compose/{m}/n2_s0/soup.safetensors" for m in cfg["methods"]} | {
        "results/compose/taft-1/n3_s0/soup.safetensors"}
    ensembles = [out for out in planned if out.endswith("/ensemble.parquet")]
    assert len(ensembles) == len(cfg["methods"])
