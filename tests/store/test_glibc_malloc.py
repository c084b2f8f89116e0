"""The pinned mmap threshold: a freed tensor above it leaves the RSS; without the pin glibc keeps it."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# In a fresh process: free a 24 MiB block (glibc then raises its threshold past 8 MiB), then
# allocate, touch and free an 8 MiB one, and print how much of it stayed resident.
PROBE = """
import re, sys
import numpy as np
from pipeline_src.job.glibc_malloc import set_mmap_threshold
def rss_mb():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
if sys.argv[1] == "pin":
    assert set_mmap_threshold(4 << 20)
big = np.ones(24 << 20, dtype=np.uint8); del big
before = rss_mb()
block = np.ones(8 << 20, dtype=np.uint8); del block
print(rss_mb() - before)
"""


def retained_mb(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    return float(out.stdout)


def test_a_pinned_threshold_returns_freed_blocks_and_the_adaptive_one_keeps_them():
    assert retained_mb("adaptive") > 6  # the 8 MiB block came from the heap and stayed
    assert retained_mb("pin") < 2


def test_every_job_pins_it_unless_the_user_set_it(monkeypatch):
    from pipeline_src.runner import execute
    from pipeline_src.runner.step_args import StepArgs

    calls = []
    monkeypatch.setattr(execute, "set_mmap_threshold", calls.append)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert execute.execute("no_such_step", StepArgs()) == 1  # fails after the pin
    assert calls == [execute.JOB_MMAP_THRESHOLD]
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    execute.execute("no_such_step", StepArgs())
    assert calls == [execute.JOB_MMAP_THRESHOLD]


def test_a_step_with_its_own_threshold_gets_it_after_the_default(monkeypatch):
    from pipeline_src.runner import execute
    from pipeline_src.runner.step_args import StepArgs
    from pipeline_src.steps import train_vectorized

    calls = []
    monkeypatch.setattr(execute, "set_mmap_threshold", calls.append)
    monkeypatch.setattr(train_vectorized, "main", lambda args: None)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert execute.execute("train_vectorized", StepArgs()) == 0
    assert calls == [execute.JOB_MMAP_THRESHOLD, train_vectorized.MMAP_THRESHOLD]
    assert train_vectorized.MMAP_THRESHOLD != execute.JOB_MMAP_THRESHOLD


# In a fresh process, with a job's pin: run a loop that frees what the next step reuses, then one
# that keeps 1 MiB a step, calling `release_freed` after each step as the job loops do; print the
# number of real trims (glibc's malloc_trim, counted) in each, and the RSS growth of the first.
TRIM_PROBE = """
import numpy as np
from pipeline_src.job import glibc_malloc as gm
assert gm.set_mmap_threshold(4 << 20)
libc, trims = gm.glibc(), []
class Counting:
    def malloc_trim(self, pad):
        trims.append(pad)
        return libc.malloc_trim(pad)
gm._libc = Counting()
gm.release_freed(min_interval_s=0)  # the first call trims
start, steady = gm.resident_bytes(), len(trims)
for _ in range(200):  # the step's tensors (3 MiB, from the heap), freed, reused by the next step
    step = [np.ones(3 << 20, dtype=np.uint8) for _ in range(4)]
    del step
    gm.release_freed(min_interval_s=0)
steady, growth_mb = len(trims) - steady, (gm.resident_bytes() - start) / 2**20
kept, before = [], len(trims)
for _ in range(48):  # 1 MiB kept alive each step: the RSS grows by 48 MiB
    kept.append(np.ones(1 << 20, dtype=np.uint8))
    gm.release_freed(min_interval_s=0)
print(steady, len(trims) - before, growth_mb)
"""


def test_release_freed_trims_once_a_steady_loop_settles_and_again_as_the_rss_grows():
    from pipeline_src.job.glibc_malloc import TRIM_SLACK_BYTES

    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, check=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    steady, growing, growth_mb = out.stdout.split()
    assert int(steady) == 0  # trimming would only fault the next step's pages in again
    assert float(growth_mb) < TRIM_SLACK_BYTES / 2**20
    assert int(growing) >= 48 // (TRIM_SLACK_BYTES >> 20) - 1  # a trim per slack of growth
