"""GPU slot locks with real concurrent processes and a fake device count (no GPU needed)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_src.runner.gpu_slots import acquire_gpu, visible_devices
from tests.conftest import REPO

# A job: take `gpus` slots, print CUDA_VISIBLE_DEVICES while holding them, release on a stdin line.
HOLDER = """
import sys
from pipeline_src.runner.gpu_slots import acquire_gpu
with acquire_gpu(int(sys.argv[1]), lock_dir=sys.argv[2], poll_s=0.05) as devices:
    import os
    print(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
    sys.stdin.readline()
print(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
"""


def start(lock_dir: Path, gpus: int = 1, **env: str) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")}
    full_env.update(PIPELINE_NUM_GPUS="4", PYTHONPATH=str(REPO), **env)
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(gpus), str(lock_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=full_env)


def line_within(proc: subprocess.Popen, seconds: float) -> str | None:
    """The holder's next output line, or None if it printed nothing for `seconds`."""
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    return proc.stdout.readline().strip() if ready else None


def release(proc: subprocess.Popen) -> str:
    proc.stdin.write("\n")
    proc.stdin.flush()
    after = proc.stdout.readline().strip()
    assert proc.wait(timeout=10) == 0
    return after


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_concurrent_jobs_get_distinct_devices_and_the_fifth_waits(tmp_path, procs):
    procs += [start(tmp_path) for _ in range(4)]
    got = [line_within(p, 20) for p in procs]
    assert sorted(got) == ["0", "1", "2", "3"]
    fifth = start(tmp_path)
    procs.append(fifth)
    assert line_within(fifth, 1.5) is None  # all four slots are held
    freed = got[2]
    assert release(procs[2]) == "<unset>"  # the holder's previous environment is restored
    assert line_within(fifth, 10) == freed


def test_a_killed_holder_frees_its_slot(tmp_path, procs):
    procs += [start(tmp_path) for _ in range(4)]
    got = [line_within(p, 20) for p in procs]
    waiting = start(tmp_path)
    procs.append(waiting)
    assert line_within(waiting, 1.5) is None
    os.kill(procs[1].pid, signal.SIGKILL)  # a crash: no release code runs
    procs[1].wait()
    assert line_within(waiting, 10) == got[1]


def test_slots_map_into_an_existing_cuda_visible_devices(tmp_path, procs):
    procs += [start(tmp_path, CUDA_VISIBLE_DEVICES="3,5,6,7") for _ in range(2)]
    procs.append(start(tmp_path, gpus=2, CUDA_VISIBLE_DEVICES="3,5,6,7"))
    got = [line_within(p, 20) for p in procs]
    ids = [d for g in got for d in g.split(",")]
    assert sorted(ids) == ["3", "5", "6", "7"] and len(got[2].split(",")) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu3.lock", "gpu5.lock", "gpu6.lock", "gpu7.lock"]


def test_multi_gpu_job_waits_for_a_whole_set(tmp_path, procs):
    procs += [start(tmp_path) for _ in range(3)]
    got = [line_within(p, 20) for p in procs]
    pair = start(tmp_path, gpus=2)
    procs.append(pair)
    assert line_within(pair, 1.5) is None  # one slot free is not enough
    release(procs[0])
    assert sorted(line_within(pair, 10).split(",")) == sorted([got[0], "3"])


def test_cpu_jobs_and_slurm_jobs_take_no_slot(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with acquire_gpu(0, num_gpus_visible=4, lock_dir=tmp_path) as devices:
        assert devices is None and "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # what Slurm set for its allocation
    with acquire_gpu(1, num_gpus_visible=4, lock_dir=tmp_path) as devices:
        assert devices is None and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert list(tmp_path.iterdir()) == []


def test_impossible_requests_raise(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ValueError, match="asks for 5 GPUs but only 4"):
        with acquire_gpu(5, num_gpus_visible=4, lock_dir=tmp_path):
            pass
    with pytest.raises(ValueError, match="'gpu' must be >= 0"):
        with acquire_gpu(-1, lock_dir=tmp_path):
            pass
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ValueError, match="lists only 2"):
        visible_devices(3)
    monkeypatch.setenv("PIPELINE_NUM_GPUS", "four")
    with pytest.raises(ValueError, match="PIPELINE_NUM_GPUS"):
        visible_devices()


def test_no_visible_gpu_runs_without_a_slot(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with acquire_gpu(1, lock_dir=tmp_path) as devices:
        assert devices is None
    assert visible_devices() == []


def test_lock_waits_are_short(tmp_path, monkeypatch):
    """Acquire and release in one process many times: no slot stays held after a release."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    start_t = time.monotonic()
    for _ in range(20):
        with acquire_gpu(4, num_gpus_visible=4, lock_dir=tmp_path) as devices:
            assert devices == ["0", "1", "2", "3"]
    assert time.monotonic() - start_t < 2.0


def test_jobs_in_threads_get_their_devices_in_their_own_environment(tmp_path, monkeypatch):
    """Two GPU jobs whose clients are threads of one process (rules' `run:` blocks in Snakemake's
    process): each job's environment names its own device, and the process's stays as it was."""
    import threading

    from pipeline_src.runner import launch
    from pipeline_src.runner.job_process import JobExit
    from pipeline_src.runner.step_args import StepArgs

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PIPELINE_NUM_GPUS", "2")
    monkeypatch.setenv("PIPELINE_GPU_LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(launch, "wants_gpu_server", lambda *a: False)
    both_in = threading.Barrier(2, timeout=10)
    envs, during = [], []

    def job_on_its_devices(step, args, on_child, env):
        envs.append(env["CUDA_VISIBLE_DEVICES"])
        both_in.wait()  # both hold a slot at once
        during.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return JobExit(0, None)

    monkeypatch.setattr(launch, "stop_with_run", lambda group: None)
    monkeypatch.setattr("pipeline_src.runner.forkserver.run_in_server", job_on_its_devices)
    args = StepArgs(resources={"gpu": 1}, rule="train")
    threads = [threading.Thread(target=launch.launch, args=("train", args)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(envs) == ["0", "1"] and during == [None, None]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
