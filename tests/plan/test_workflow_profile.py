"""The workflow profile Snakemake reads by itself for this Snakefile (`profiles/default/config.yaml`)."""
from snakemake.cli import parse_args

from tests.conftest import REPO


def test_every_run_gets_threads_and_the_greedy_scheduler_unless_told_otherwise(monkeypatch):
    monkeypatch.chdir(REPO)
    _, args = parse_args(["--cores", "2"])
    assert args.force_use_threads is True  # each job's launcher in a thread of Snakemake's process
    assert args.scheduler == "greedy"  # no ILP solver started at every selection pass
    _, args = parse_args(["--cores", "2", "--scheduler", "ilp"])
    assert args.scheduler == "ilp"
