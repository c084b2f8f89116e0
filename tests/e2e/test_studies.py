"""Studies side by side (issue 36): two studies in one clone, each under results/<experiment>/.

The `.test` study runs first (the session's tiny study, copied with Snakemake's metadata); a
second, cheaper study of another `experiment` then runs in the same folder. Neither touches the
other's files, a query reads both, a forget request in one plans nothing in the other, and a
folder of the old results/<step>/ layout is refused until `move-old-layout` moves it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline_src.plan.studies import move_metadata
from tests.conftest import REPO, planned_outputs, results_of, snakemake
from tests.e2e.conftest import copy_study, tiny_config

pytestmark = pytest.mark.e2e

OTHER = "tiny-b"


def other_config() -> dict:
    """The second study: the `.test` data and backbone architecture, one method, one epoch."""
    cfg = tiny_config()
    cfg.update(experiment=OTHER, methods={"fc": {"kind": "fc"}}, shards=[1, 2], device="cpu")
    cfg["backbone"]["pretrain"]["epochs"] = 1
    cfg["train"]["epochs"] = 1
    for study in ("fusion", "forget", "last_grid"):
        del cfg[study]
    return cfg


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under `folder`."""
    return {f.relative_to(folder).as_posix(): (f.stat().st_size, f.stat().st_mtime_ns)
            for f in folder.rglob("*") if f.is_file()}


def query(workdir: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "pipeline_src.store.query", "--format", "csv", *args],
                          cwd=workdir, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def clone(tiny_study, tmp_path_factory) -> tuple[Path, dict]:
    """One working folder with the finished tiny study and, run after it, the second study; and
    the tiny study's files as they were before the second ran."""
    work = copy_study(tiny_study, tmp_path_factory.mktemp("clone"), parts=None)
    shutil.copy(tiny_study / "config.yaml", work / "config.yaml")
    (work / "other.yaml").write_text(yaml.safe_dump(other_config()))
    before = files(results_of(work))
    snakemake(work, "--cores", "2", "--configfile", str(work / "other.yaml"))
    return work, before


def test_the_second_study_completes_and_leaves_the_first_untouched(clone):
    work, before = clone
    other = results_of(work, OTHER)
    assert (other / "report" / "index.md").is_file() and (other / "train" / "fc" / "n2_s0" / "shard1.safetensors").is_file()
    assert files(results_of(work)) == before  # not one file of the first study written, added or removed
    assert sorted(p.name for p in (work / "results").iterdir() if p.is_dir()) == ["tiny", OTHER]
    # Each study is still complete: neither plans a job, nor does the first after the second.
    for config in ("config.yaml", "other.yaml"):
        assert planned_outputs(snakemake(work, "-n", "--configfile", str(work / config))) == []


def test_a_query_reads_both_studies(clone):
    work, _ = clone
    out = query(work, "--all-studies", "SELECT DISTINCT experiment FROM metrics ORDER BY 1")
    assert out.split() == ["experiment", "tiny", OTHER]
    out = query(work, "--studies", f"tiny,{OTHER}", "SELECT experiment, count(*) AS n FROM samples GROUP BY 1 ORDER BY 1")
    assert [r.split(",")[0] for r in out.split()[1:]] == ["tiny", OTHER]  # a view without the column gains it
    one = query(work, "--study", OTHER, "SELECT count(*) AS n FROM metrics").split()[1]
    assert query(work, "--all-studies", f"SELECT count(*) AS n FROM \"{OTHER}\".metrics").split()[1] == one
    assert query(work, "--configfile", "other.yaml", "SELECT count(*) AS n FROM metrics").split()[1] == one
    table = query(work, "--compare", "tiny", OTHER, "table1_methods")
    header = table.splitlines()[0].split(",")
    assert header[0] == "method" and "accuracy [tiny]" in header and f"accuracy [{OTHER}]" in header
    rows = {r.split(",")[0]: r.split(",")[1:] for r in table.splitlines()[1:]}
    assert rows["fc"][0] and rows["fc"][1] and rows["taft-1"][1] == ""  # taft-1: only the tiny study has it
    claims = query(work, "--compare", "tiny", OTHER, "claims").splitlines()[0]
    assert "holds [tiny]" in claims and f"holds [{OTHER}]" in claims


def test_a_forget_request_in_one_study_plans_nothing_in_the_other(clone, tmp_path):
    work, _ = clone
    manifest = pq.read_table(results_of(work, OTHER) / "split" / "n2_s0" / "shard1.parquet").to_pydict()
    (tmp_path / "ids.txt").write_text("\n".join(manifest["sample_id"][:2]) + "\n")
    cfg = other_config()
    cfg["forget"] = {"requests": str(tmp_path / "ids.txt")}
    (tmp_path / "forget.yaml").write_text(yaml.safe_dump(cfg))
    planned = planned_outputs(snakemake(work, "-n", "--configfile", str(tmp_path / "forget.yaml")))
    assert f"results/{OTHER}/split/n2_s0/shard1.parquet" in " ".join(planned)
    assert all(p.startswith(f"results/{OTHER}/") for out in planned for p in out.split(", ")), planned
    assert planned_outputs(snakemake(work, "-n", "--configfile", str(work / "config.yaml"))) == []
    # The audit takes the study by name: the shard model of that study trained on the ids.
    audit = subprocess.run([sys.executable, "-m", "pipeline_src.store.audit", "--study", OTHER,
                            "train/fc/n2_s0/shard1.safetensors", str(tmp_path / "ids.txt")], cwd=work,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert audit.returncode == 1 and f"results/{OTHER}/train/fc/n2_s0/shard1.safetensors" in audit.stdout, audit.stderr


def test_an_old_layout_is_refused_then_moved_without_a_rerun(tiny_study, tmp_path):
    work = copy_study(tiny_study, tmp_path / "old")  # the prepared study: samples, backbone, features
    shutil.copy(tiny_study / "config.yaml", work / "config.yaml")
    for p in list(results_of(work).iterdir()):  # results/tiny/<step> -> results/<step>, as before issue 36
        p.rename(work / "results" / p.name)
    results_of(work).rmdir()
    move_metadata(work, "results/tiny", "results")
    targets = ["results/tiny/prepare/samples.parquet", "results/tiny/pretrain/model.safetensors",
               *sorted(f"results/tiny/{p.relative_to(work / 'results').as_posix()}"
                       for p in (work / "results" / "features").rglob("*") if p.is_file())]
    old = files(work / "results")
    proc = snakemake(work, "-n", *targets, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "old layout" in out and "move-old-layout --study tiny" in out, out
    assert files(work / "results") == old and not results_of(work).exists()
    move = subprocess.run([sys.executable, "-m", "pipeline_src.plan.studies", "move-old-layout", "--directory", str(work)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert move.returncode == 0 and "into results/tiny/" in move.stdout, move.stderr
    assert files(results_of(work)) == old  # moved: same files, same times
    assert planned_outputs(snakemake(work, "-n", *targets)) == []  # and nothing reruns
