"""`fork_in_own_group`: a server may kill a child's group the moment `fork` returns (its client died
right after asking), before the child ran a line. A group the child sets itself is not there yet then,
so the kill missed it and the server waited for the whole job (test_interrupt's gpu-server case)."""
from __future__ import annotations

import os
import time

from pipeline_src.runner.job_process import fork_in_own_group, kill_group, reap


def test_the_childs_group_exists_when_fork_returns_and_one_kill_stops_it():
    for _ in range(20):
        pid = fork_in_own_group()
        if pid == 0:
            time.sleep(30)  # a job that would run on if the kill missed it
            os._exit(0)
        assert os.getpgid(pid) == pid != os.getpgrp()
        t0 = time.monotonic()
        kill_group(pid)
        done = reap(pid)
        assert done.code == 128 + 9 and time.monotonic() - t0 < 10


def test_killing_a_reaped_childs_group_is_a_no_op():
    pid = fork_in_own_group()
    if pid == 0:
        os._exit(3)
    assert reap(pid).code == 3
    kill_group(pid)
