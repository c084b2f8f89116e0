"""The fork server's heap on transparent huge pages (`runner/huge_page_heap.py`): the server starts
with glibc's tunable unless the user set it, and a job forked from it runs with huge pages as a
job did before (off where the kernel gives them only on `madvise`), checked in a real server's
child through `/proc/self/status`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_src.runner import forkserver
from pipeline_src.runner.huge_page_heap import (ADDED, HUGE_PAGE_HEAP, small_pages_as_before, thp_mode,
                                                with_huge_page_heap)
from tests.conftest import REPO

LIGHT = "tests.runner.light_server"


def test_the_tunable_is_added_beside_the_users_and_never_over_theirs():
    assert with_huge_page_heap({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": HUGE_PAGE_HEAP, ADDED: "1"}
    mine = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert with_huge_page_heap(mine)["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{HUGE_PAGE_HEAP}"
    theirs = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert with_huge_page_heap(theirs) == theirs  # no marker either: their jobs keep what they chose


def test_the_kernel_mode_is_the_bracketed_word(tmp_path):
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    assert thp_mode(str(tmp_path / "enabled")) == "madvise"
    assert thp_mode(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("marked, mode, turned_off", [(True, "madvise", True), (True, "always", False),
                                                      (True, "never", False), (False, "madvise", False)])
def test_only_a_job_of_a_huge_page_server_on_an_madvise_kernel_turns_them_off(marked, mode, turned_off):
    code = ("import sys\nfrom pipeline_src.runner.huge_page_heap import small_pages_as_before\n"
            f"did = small_pages_as_before({mode!r})\n"
            "flag = [l for l in open('/proc/self/status') if l.startswith('THP_enabled:')]\n"
            "print(did, flag[0].split()[1] if flag else 'unknown')")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(ADDED, None)
    if marked:
        env[ADDED] = "1"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    did, flag = out.stdout.split()
    assert did == str(turned_off)
    if flag != "unknown":
        assert flag == ("0" if turned_off else "1")
    assert small_pages_as_before("always") is False  # this process: never marked, never changed


def test_a_started_servers_heap_is_on_huge_pages_and_its_job_runs_as_before(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    path = tmp_path / "s.sock"
    assert forkserver.prestart(path, module=LIGHT)
    try:
        done = forkserver.run_in_server("x", None, call="tests.runner.thp_probe:thp_enabled", path=path)
        server = subprocess.run(["pgrep", "-f", f"{LIGHT} {path}"], capture_output=True, text=True).stdout.split()
        assert len(server) == 1
        environ = Path(f"/proc/{server[0]}/environ").read_bytes().split(b"\0")
        assert f"GLIBC_TUNABLES={HUGE_PAGE_HEAP}".encode() in environ
        if done.code != 7:  # the kernel says: off only where it gives huge pages on madvise alone
            assert done.code == (0 if thp_mode() == "madvise" else 1)
    finally:
        for pid in subprocess.run(["pgrep", "-f", f"{LIGHT} {path}"], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", pid])
