"""Two studies in one clone (issue 44, 5.1 and 5.2): while study A runs, study B's run ends and an
--unlock of B runs, both of which delete Snakemake's whole lock folder; a second run of A is still
refused (before any job, naming the running process), and so is an --unlock of A."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, SNAKEMAKE, results_of, snakemake
from tests.e2e.conftest import tiny_config

pytestmark = pytest.mark.e2e
ENV = {"PIPELINE_FORKSERVER": "0"}  # every job a child of its Snakemake: one process group to stop


def study_configs(workdir: Path) -> None:
    """a.yaml: the tiny study with a pretraining long enough to be caught running; b.yaml: another study."""
    cfg = tiny_config()
    cfg["device"] = "cpu"
    cfg["backbone"]["pretrain"]["epochs"] = 5000
    (workdir / "a.yaml").write_text(yaml.safe_dump(cfg))
    cfg.update(experiment="tiny-b")
    cfg["backbone"]["pretrain"]["epochs"] = 1
    (workdir / "b.yaml").write_text(yaml.safe_dump(cfg))


def test_a_running_study_is_not_run_twice_whatever_another_study_does(tmp_path):
    study_configs(tmp_path)
    backbone = "results/tiny/pretrain/model.safetensors"
    first = subprocess.Popen([*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "1", backbone, "--configfile",
                              "a.yaml"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), **ENV},
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        log = results_of(tmp_path, "tiny") / "logs" / "pretrain" / "pretrain.log"
        deadline = time.monotonic() + 300
        while not log.exists():  # pretraining: the first run holds the study from here on
            assert first.poll() is None and time.monotonic() < deadline, "the first run ended before pretraining"
            time.sleep(0.2)
        snakemake(tmp_path, "--cores", "1", "results/tiny-b/prepare/samples.parquet", "--configfile",
                  str(tmp_path / "b.yaml"), **ENV)
        assert not (tmp_path / ".snakemake" / "locks").exists()  # Snakemake deleted every lock, the first run's too
        snakemake(tmp_path, "--unlock", "--configfile", str(tmp_path / "b.yaml"), **ENV)  # another study's --unlock: allowed
        # A second run of A (a target the first does not build, as `report` beside a retraining)
        manifest = "results/tiny/split/n1_s0/shard0.parquet"
        second = snakemake(tmp_path, "--cores", "1", manifest, "--configfile", str(tmp_path / "a.yaml"), check=False,
                           timeout=120, **ENV)
        out = second.stdout + second.stderr
        assert second.returncode != 0 and f"study 'tiny' is running already in this folder (Snakemake pid {first.pid} " \
            in out, out[-3000:]
        assert not (tmp_path / manifest).exists() and "rule " not in out  # refused before any job
        unlock = snakemake(tmp_path, "--unlock", "--configfile", str(tmp_path / "a.yaml"), check=False, timeout=120,
                           **ENV)
        assert unlock.returncode != 0 and "nothing was unlocked" in unlock.stdout + unlock.stderr
        assert first.poll() is None and log.exists()  # the first run goes on, its job untouched
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the group this test started: Snakemake and its job
        first.wait()
