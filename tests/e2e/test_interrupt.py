"""Kill a running study and recover with the commands of docs/reliability.md (issue 15, item 8); a SIGKILL of the
Snakemake process alone stops its jobs before they write anything (issue 24, item 1)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from base64 import urlsafe_b64encode
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from safetensors import safe_open

from pipeline_src.plan.run_start import REBUILD_JOURNAL
from tests.conftest import REPO, planned_outputs, results_of
from tests.e2e.conftest import copy_study
from tests.store.test_atomic import killed_writer

pytestmark = pytest.mark.e2e
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def tiny_one_method() -> dict:
    """The .test study cut to one method and one shard count; training long enough to be caught."""
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg.update(methods={"nlft-1": {"kind": "nlft", "k": 1}}, shards=[2], fusion={"enabled": False},
               forget={"study": {"enabled": False}}, last_grid={"enabled": False}, search={"enabled": False})
    cfg["train"]["epochs"] = 200  # seconds per training job: the kill lands in one
    return cfg


def recovery_commands() -> list[list[str]]:
    """The commands of docs/reliability.md's 'When a run is interrupted' section, as written (comments cut)."""
    page = (REPO / "docs" / "reliability.md").read_text()
    section = page.split("## When a run is interrupted", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash[^\n]*\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].split()[1:] for line in block.splitlines() if line.startswith(".venv/bin/snakemake")]


def processes_in(folder: Path) -> list[int]:
    """Pids of processes whose working directory is `folder` (a job or a fork-server child there)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == folder:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def processes_naming(folder: Path) -> list[int]:
    """Pids of processes whose command line names a path in `folder` (a server of this test's sockets)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(folder).encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def training_now(workdir: Path, log: Path) -> bool:
    """A training job has started (its log exists) and not finished (no model yet)."""
    model = results_of(workdir, "tiny") / "train" / log.relative_to(results_of(workdir, "tiny") / "logs" / "train").with_suffix(".safetensors")
    return log.exists() and not model.exists() and bool(processes_in(workdir))  # the log opens at the start


def metric_rows(workdir: Path) -> int:
    return duckdb.sql(f"SELECT count(*) FROM read_parquet('{results_of(workdir, 'tiny')}/metrics/**/*.parquet', "
                      "union_by_name=true)").fetchall()[0][0]


def run(workdir: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    """Snakemake in `workdir`, run from there as a user would (a relative --configfile is read there)."""
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True, env=env,
                          cwd=workdir)


def test_a_killed_run_recovers_with_the_documented_commands(tmp_path, tiny_study, sockets):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_FORKSERVER": "1", "TMPDIR": str(sockets)}
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    study = ("--configfile", "my_study.yaml")  # the page's name; no config.yaml (default study) in the folder
    for d in (clean, killed):
        copy_study(tiny_study, d)  # the prepared samples and backbone
        (d / "my_study.yaml").write_text(yaml.safe_dump(tiny_one_method()))
    # every file an uninterrupted run writes: a dry run of the same study, from the same start
    proc = run(clean, "-n", "--cores", "2", *study, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = [f.strip() for line in planned_outputs(proc) for f in line.split(",")]
    assert any(f.endswith(".safetensors") for f in expected) and any(f.endswith(".parquet") for f in expected)

    smk = subprocess.Popen([*SNAKEMAKE, "--directory", str(killed), "--cores", "2", *study], env=env, cwd=killed,
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    train_logs = results_of(killed, "tiny") / "logs" / "train"
    deadline = time.monotonic() + 300
    while not (caught := [log for log in train_logs.rglob("shard*.log") if training_now(killed, log)]):
        assert smk.poll() is None and time.monotonic() < deadline, "the run ended before a training job ran"
        time.sleep(0.1)
    os.killpg(smk.pid, signal.SIGKILL)  # Snakemake and its job clients; the fork server is in its own session
    smk.wait()
    for _ in range(100):  # the fork server kills the orphaned job, then exits
        if not processes_in(killed) and not list(sockets.glob("*.sock")):
            break
        time.sleep(0.1)
    assert not processes_in(killed), "a job of the killed run is still running"
    assert not list(sockets.glob("*.sock")), "the fork server outlived its killed client"
    for log in caught:  # the interrupted job was stopped, not left to finish behind the rerun
        assert not training_now(killed, log) and not log.with_suffix(".bench.tsv").exists(), log
        model = results_of(killed, "tiny") / "train" / log.relative_to(train_logs).with_suffix(".safetensors")
        assert not model.exists(), f"{model}: the killed run's job finished after the kill"

    proc = run(killed, "--cores", "2", *study, env=env)
    assert proc.returncode != 0 and re.search(r"unlock|incomplete", proc.stderr, re.I), proc.stderr[-2000:]
    killed_writer(results_of(killed, "tiny") / "compose" / "regmean.parquet")  # a kill between write and rename
    assert list(results_of(killed, "tiny").rglob("*.tmp"))
    for args in recovery_commands():
        proc = run(killed, *args, env=env)
        assert proc.returncode == 0, f"{args}: {proc.stderr[-3000:]}"

    assert not [f for f in expected if not (killed / f).exists()], "an output of the study is missing after recovery"
    proc = run(killed, "-n", "--cores", "2", *study, env=env)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert metric_rows(killed) > 0
    files = list(results_of(killed, "tiny").rglob("*.parquet")) + list(results_of(killed, "tiny").rglob("*.safetensors"))
    for f in files:
        if f.suffix == ".parquet":
            pq.read_table(f)
        else:
            with safe_open(str(f), "pt") as st:
                for k in st.keys():
                    st.get_tensor(k)
    assert not list(results_of(killed, "tiny").rglob("*.tmp"))


def result_files(workdir: Path, logs: bool = True) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under results/ (without results/logs/ for logs=False)."""
    files = {}
    for f in results_of(workdir, "tiny").rglob("*"):
        rel = f.relative_to(workdir).as_posix()
        if f.is_file() and (logs or not rel.startswith("results/tiny/logs/")):
            st = f.stat()
            files[rel] = (st.st_size, st.st_mtime_ns)
    return files


@pytest.mark.parametrize("forkserver", ["1", "0", "gpu-server"])
def test_a_sigkill_of_snakemake_alone_stops_its_jobs(tmp_path, tiny_study, forkserver, sockets):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_FORKSERVER": "1" if forkserver == "gpu-server" else forkserver,
           "PIPELINE_GPU_SERVER": "1" if forkserver == "gpu-server" else "0", "TMPDIR": str(sockets)}
    killed = copy_study(tiny_study, tmp_path / "killed")
    (killed / "config.yaml").write_text(yaml.safe_dump(tiny_one_method()))
    smk = subprocess.Popen([*SNAKEMAKE, "--directory", str(killed), "--cores", "2"], env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    train_logs = results_of(killed, "tiny") / "logs" / "train"
    try:
        deadline = time.monotonic() + 300
        while not [log for log in train_logs.rglob("shard*.log") if training_now(killed, log)]:
            assert smk.poll() is None and time.monotonic() < deadline, "the run ended before a training job ran"
            time.sleep(0.1)
        os.kill(smk.pid, signal.SIGKILL)  # Snakemake only: the servers and the job processes live on
        at_kill = result_files(killed, logs=False)
        smk.wait()
        # A server notices the closed connection of a running job within its select (1 s), a job
        # process its parent's death at once (PR_SET_PDEATHSIG); neither writes anything after (checked below).
        for _ in range(300):
            if not processes_in(killed):
                break
            time.sleep(0.1)
        assert not processes_in(killed), "a job of the killed Snakemake is still running"
        after = result_files(killed)
        time.sleep(3)
        assert result_files(killed) == after, "a file changed after the jobs stopped"
        new = {f: v for f, v in after.items() if not f.startswith("results/tiny/logs/") and at_kill.get(f) != v}
        assert not new, f"written after the kill: {sorted(new)}"
        if forkserver == "gpu-server":  # it stopped the killed job's worker (above) and serves on
            assert list(sockets.glob("vitpipe-gpu-*.sock"))
            return
        for _ in range(50):
            if not list(sockets.glob("*.sock")):
                break
            time.sleep(0.1)
        assert not list(sockets.glob("*.sock")), "the fork server outlived the killed run's jobs"
    finally:
        for pid in processes_in(killed):  # on the code before the fix: do not leave the orphans running
            os.kill(pid, signal.SIGKILL)
        for pid in processes_naming(sockets):  # the GPU job server and its idle workers, started here
            os.kill(pid, signal.SIGKILL)


def test_a_killed_forcerun_loses_nothing_after_the_readme_recovery(tmp_path, tiny_study):
    """A `--forcerun` deletes the old outputs of its jobs when they start; killed then, the files were
    lost: their readers were up to date, so Snakemake said "Nothing to be done" (issue 33, item 1)."""
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_FORKSERVER": "1", "TMPDIR": str(sockets)}
    killed = copy_study(tiny_study, tmp_path / "killed", parts=None)
    (killed / "my_study.yaml").write_text((tiny_study / "config.yaml").read_text())
    study = ("--configfile", "my_study.yaml")
    before = sorted(f for f in result_files(killed, logs=False) if not f.startswith("results/tiny/report/"))
    shards = [f"results/tiny/train/taft-1/n2_s0/shard{i}.safetensors" for i in (0, 1)]
    assert all(f in before for f in shards)

    smk = subprocess.Popen([*SNAKEMAKE, "--directory", str(killed), "--cores", "2", *study, "--forcerun", *shards],
                           env=env, cwd=killed, start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while all((killed / f).exists() for f in shards):  # Snakemake deletes a forced job's outputs as it starts it
        assert smk.poll() is None and time.monotonic() < deadline, "the forced jobs never started"
        time.sleep(0.01)
    os.killpg(smk.pid, signal.SIGKILL)
    smk.wait()
    for _ in range(100):
        if not processes_in(killed):
            break
        time.sleep(0.1)
    lost = [f for f in before if not (killed / f).exists()]
    assert lost, "the kill came after the forced jobs had rebuilt their files"
    # The run listed them before its first job; a kill between Snakemake's deletion and its
    # incomplete marker (a few ms, caught once in CI) must lose nothing either: drop the markers.
    assert set(shards) <= set((killed / ".snakemake" / REBUILD_JOURNAL).read_text().split())
    for f in shards:
        (killed / ".snakemake" / "incomplete" / urlsafe_b64encode(f.encode()).decode()).unlink(missing_ok=True)
    killed_writer(results_of(killed, "tiny") / "compose" / "regmean.parquet")  # a kill between write and rename

    for args in recovery_commands():
        proc = run(killed, *args, env=env)
        assert proc.returncode == 0, f"{args}: {proc.stderr[-3000:]}"
    missing = [f for f in before if not (killed / f).exists()]
    assert not missing, f"lost after the README's recovery: {missing[:5]} (of {lost})"
    for f in before:
        if f.endswith(".parquet"):
            pq.read_table(killed / f)
        elif f.endswith(".safetensors"):
            with safe_open(str(killed / f), "pt") as st:
                for k in st.keys():
                    st.get_tensor(k)
    assert not list(results_of(killed, "tiny").rglob("*.tmp"))
    proc = run(killed, "-n", "--cores", "2", *study, env=env)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stderr[-2000:]


def test_temp_files_of_killed_writers_go_even_when_no_job_starts(tmp_path, tiny_study):
    killed = copy_study(tiny_study, tmp_path / "done", parts=None)
    (killed / "my_study.yaml").write_text((tiny_study / "config.yaml").read_text())
    killed_writer(results_of(killed, "tiny") / "compose" / "regmean.parquet")
    assert list(results_of(killed, "tiny").rglob("*.tmp"))
    proc = run(killed, "--cores", "2", "--configfile", "my_study.yaml", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert not list(results_of(killed, "tiny").rglob("*.tmp"))


def test_stop_snakemake_ends_a_running_pretrain_now_and_leaves_no_lock(tmp_path, sockets):
    """docs/reliability.md's way to stop a study now (`runner/stop_run.py`, issue 44): SIGINT to the
    run's process group ends the running job (a pretrain of 2,000 epochs here) within seconds, where
    Snakemake alone would wait for it; nothing runs or is written afterwards, the lock is gone, and
    the next run plans the stopped job again."""
    from pipeline_src.runner.stop_run import start_snakemake, stop_snakemake

    study = tmp_path / "study"
    study.mkdir()
    cfg = tiny_one_method()
    cfg["backbone"]["pretrain"]["epochs"] = 2000
    (study / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_FORKSERVER": "1", "TMPDIR": str(sockets)}
    smk = start_snakemake([*SNAKEMAKE, "--directory", str(study), "--cores", "2"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = results_of(study, "tiny") / "logs" / "pretrain" / "pretrain.log"
    try:
        deadline = time.monotonic() + 300
        while not (log.exists() and "pretrain" in log.read_text(errors="replace") and processes_in(study)):
            assert smk.poll() is None and time.monotonic() < deadline, "the run ended before pretrain ran"
            time.sleep(0.1)
        t0 = time.monotonic()
        assert stop_snakemake(smk, grace_s=60) == "sigint"
        assert time.monotonic() - t0 < 30, "Snakemake waited for its job"
        for _ in range(50):
            if not processes_in(study):
                break
            time.sleep(0.1)
        assert not processes_in(study), "a job of the stopped run still runs"
        files = result_files(study)
        time.sleep(2)
        assert result_files(study) == files, "a file changed after the run stopped"
        assert not (results_of(study, "tiny") / "pretrain" / "model.safetensors").exists()
        assert not list((study / ".snakemake" / "locks").glob("*")), "the lock stays"
        proc = run(study, "-n", "--cores", "2", env=env)  # the next run just reruns the stopped job
        assert proc.returncode == 0 and any("pretrain/model.safetensors" in o for o in planned_outputs(proc)), \
            proc.stderr[-2000:]
    finally:
        for pid in processes_in(study):
            os.kill(pid, signal.SIGKILL)
        if smk.poll() is None:
            smk.kill()
