"""A job's CPU threads on a shared machine (`runner/cpu_threads.py`, issue 44): libgomp's spin
count set before torch loads, and no more intra-op threads than the CPUs the process may use
(affinity mask, cgroup v1 and v2 quotas, read from real files laid out as the kernel does)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_src.runner.cpu_threads import (
    USER_WAIT,
    WAIT_POLICY,
    cgroup_cpu_limit,
    job_threads,
    set_wait_policy,
    usable_cpus,
)
from pipeline_src.runner.job_process import run_measured

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_takes_the_smallest_quota_of_the_process_cgroup_and_its_ancestors(tmp_path):
    write(tmp_path / "self" / "cgroup", "0::/user.slice/job\n")
    root = tmp_path / "fs"
    write(root / "user.slice" / "job" / "cpu.max", "max 100000\n")
    write(root / "user.slice" / "cpu.max", "150000 100000\n")  # 1.5 CPUs, one level up
    write(root / "cpu.max", "400000 100000\n")
    assert cgroup_cpu_limit(tmp_path / "self" / "cgroup", root) == 1.5
    write(root / "user.slice" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path / "self" / "cgroup", root) == 4.0
    (root / "cpu.max").unlink()  # the root cgroup has no cpu.max: no limit anywhere
    assert cgroup_cpu_limit(tmp_path / "self" / "cgroup", root) is None


def test_cgroup_v1_reads_the_cpu_controllers_quota(tmp_path):
    write(tmp_path / "cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    root = tmp_path / "fs"
    write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "50000\n")
    write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path / "cgroup", root) == 0.5
    write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(tmp_path / "cgroup", root) is None
    assert cgroup_cpu_limit(tmp_path / "missing", root) is None  # no /proc: no limit known


def test_threads_are_capped_by_affinity_and_the_quota_rounded_up():
    assert usable_cpus({0, 1, 2, 3}, quota=None) == 4
    assert usable_cpus({0, 1, 2, 3}, quota=1.5) == 2  # 1.5 CPUs still run two threads part of the time
    assert usable_cpus({0, 1, 2, 3}, quota=2.0) == 2
    assert usable_cpus({0, 1}, quota=8.0) == 2
    assert usable_cpus({0}, quota=0.1) == 1
    assert job_threads(2, cpus=1) == 1 and job_threads(2, cpus=16) == 2 and job_threads(0, cpus=4) == 1


def test_the_users_wait_policy_wins():
    for users in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(users)
        assert set_wait_policy(env) == {} and env == users  # a spin count added would override ACTIVE
    env = {"PATH": "/bin"}
    assert set_wait_policy(env) == WAIT_POLICY and env == {"PATH": "/bin", **WAIT_POLICY}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux affinity masks")
def test_a_job_bound_to_one_cpu_runs_one_thread():
    code = ("import os, torch; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from pipeline_src.runner.runtime import set_up_job; set_up_job(2, 0); print(torch.get_num_threads())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.splitlines()[-1] == "1"
    assert "[threads] 1 intra-op thread(s), not the declared 2" in proc.stdout


def test_a_job_process_loads_libgomp_with_the_jobs_spin_count(monkeypatch, capfd):
    for key in USER_WAIT:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_DISPLAY_ENV", "VERBOSE")  # libgomp prints the values it read when it loads
    done = run_measured("-", None, call="tests.runner.omp_probe:parallel_op")
    assert done.code == 0
    err = capfd.readouterr().err
    assert f"GOMP_SPINCOUNT = '{WAIT_POLICY['GOMP_SPINCOUNT']}'" in err, err[-2000:]
