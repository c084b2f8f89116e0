"""Real Snakemake runs in temp copies of the workflow (issue 15, items 1, 2 and 7)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, results_of
from tests.conftest import snakemake as run_snakemake
from tests.e2e.conftest import copy_study

TINY = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())


def copy_workflow(dst: Path, config: dict | None = None) -> Path:
    """A runnable copy of the workflow (Snakefile, rules, package) with its own config.yaml."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "config.yaml", ".test", "profiles", "workflow", "pipeline_src"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dst / name)
    if config is not None:
        (dst / "config.yaml").write_text(yaml.safe_dump(config))
    return dst


def snakemake(wf: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run the copy's own Snakefile in the copy; PYTHONPATH and the fork server as given."""
    run_env = {**os.environ, "PIPELINE_FORKSERVER": "0", "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(wf / "Snakefile"),
                           "--directory", str(wf), *args], capture_output=True, text=True, env=run_env)


def out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- item 1
def test_a_configfile_replaces_the_default_study(tmp_path):
    wf = copy_workflow(tmp_path / "wf")  # config.yaml is the default study (nlft-4: deeper than .test's backbone)
    proc = snakemake(wf, "-n", "--configfile", str(wf / ".test" / "config.yaml"))
    assert proc.returncode == 0, out(proc)[-3000:]
    assert "taft-1-vec" in out(proc) and "nlft-4" not in out(proc)
    # --config key=value still overrides, with and without a --configfile
    for extra in ([], ["--configfile", str(wf / ".test" / "config.yaml")]):
        proc = snakemake(wf, "-n", *extra, "--config", "device=tpu")
        assert proc.returncode != 0 and "config key 'device'" in out(proc), out(proc)[-3000:]


# ----------------------------------------------------------------------------- item 2
def test_a_bad_backbone_fails_before_any_job_and_keeps_the_old_one(tmp_path, tiny_study):
    wf = copy_workflow(tmp_path / "wf", TINY)
    copy_study(tiny_study, wf, parts=("prepare", "pretrain", "metrics/pretrain"))  # the old backbone
    kept = sorted(p for d in ("results/tiny/pretrain", "results/tiny/metrics/pretrain") for p in (wf / d).iterdir())
    before = {p: p.read_bytes() for p in kept}
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes((results_of(wf) / "pretrain/model.safetensors").read_bytes()[:-64])
    bad_ckpt = {**TINY, "backbone": {**TINY["backbone"], "source": "checkpoint", "checkpoint": str(truncated)}}
    bad_name = {**TINY, "backbone": {"source": "timm", "timm_name": "vit_no_such_model_patch4"}}
    for bad, key in ((bad_ckpt, "backbone.checkpoint"), (bad_name, "backbone.timm_name")):
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        proc = snakemake(wf, "--cores", "1", "--configfile", str(tmp_path / "bad.yaml"))
        assert proc.returncode != 0
        assert f"config key '{key}'" in out(proc), out(proc)[-3000:]
        assert "rule pretrain" not in out(proc)  # no job started
        assert {p: p.read_bytes() for p in kept} == before


# ----------------------------------------------------------------------------- item 7
def _servers_of(tmpdir: Path) -> list[int]:
    """Pids of the fork servers whose socket lies in `tmpdir` (only this test's)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and b"pipeline_src.runner.forkserver" in cmd and any(str(tmpdir).encode() in c for c in cmd):
            pids.append(int(proc.name))
    return pids


@pytest.fixture
def private_tmpdir(tmp_path):
    tmpdir = tmp_path / "sockets"
    tmpdir.mkdir()
    yield tmpdir
    for pid in _servers_of(tmpdir):  # the servers this test started; they would idle for 2 minutes
        os.kill(pid, 9)


@pytest.mark.parametrize("forkserver", ["1", "0"])
def test_each_workflow_runs_its_own_code(tmp_path, private_tmpdir, forkserver):
    copies = {}
    for name in ("a", "b"):
        wf = copy_workflow(tmp_path / name, TINY)
        with (wf / "pipeline_src/steps/prepare.py").open("a") as f:
            # runs in the job (the fork server imports step modules before any job: not at import)
            f.write(f"\n_main = main\n\n\ndef main(args):\n    print('code of copy {name}')\n    _main(args)\n")
        copies[name] = wf
    # PYTHONPATH (like one editable install shared by both) points at copy a; a's jobs run first so
    # its fork server is up when b's jobs start.
    env = dict(PYTHONPATH=str(copies["a"]), PIPELINE_FORKSERVER=forkserver, TMPDIR=str(private_tmpdir))
    for name, wf in copies.items():
        proc = snakemake(wf, "--cores", "1", "results/tiny/prepare/samples.parquet", **env)
        assert proc.returncode == 0, out(proc)[-3000:]
        log = (results_of(wf) / "logs/prepare/prepare.log").read_text()
        assert f"code of copy {name}" in log and "code of copy " + ("b" if name == "a" else "a") not in log
    if forkserver == "1":
        assert len(_servers_of(private_tmpdir)) == 2  # one per workflow copy


def test_the_fork_server_is_keyed_by_the_code(tmp_path):
    wf = copy_workflow(tmp_path / "wf")

    def key() -> str:
        code = "from pipeline_src.runner.forkserver import socket_path; print(socket_path())"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(wf)}).stdout

    first = key()
    assert key() == first
    (wf / "pipeline_src" / "__pycache__").mkdir(exist_ok=True)  # byte code is not code
    (wf / "pipeline_src" / "__pycache__" / "x.cpython.pyc").write_bytes(b"\0")
    assert key() == first
    with (wf / "pipeline_src/steps/prepare.py").open("a") as f:
        f.write("\n# edited\n")
    assert key() != first


# ----------------------------------------------------------------------------- issue 24, item 7
def test_nested_config_values_are_read_as_the_schemas_types(tmp_path):
    """`--config shards=[1,3]` and nested mappings reach the schema as strings (YAML's base loader)."""
    proc = run_snakemake(tmp_path, "-n", "--configfile", str(REPO / ".test" / "config.yaml"),
                         "--config", "shards=[1,3]", "train={epochs: 3, lr: 1e-3}", "fusion={enabled: false}",
                         check=False)
    assert proc.returncode == 0, out(proc)[-3000:]
    planned = out(proc)
    assert "results/tiny/train/fc/n3_s0/shard2.safetensors" in planned and "/n2_s0/" not in planned
    assert "rule fusion_train" not in planned and "rule fuse:" not in planned  # fusion={enabled: false} read as false, not the string "false"
