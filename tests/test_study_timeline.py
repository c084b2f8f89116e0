"""benchmarks/study_timeline.py against a timeline worked out by hand."""
from __future__ import annotations

import importlib.util
import os

import pytest

from pipeline_src.store.job_bench import write_job_bench
from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("study_timeline", REPO / "benchmarks" / "study_timeline.py")
study_timeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study_timeline)


def test_packing_of_a_hand_made_timeline(tmp_path):
    # 2 cores, 10 s: a runs 0-10 (9 CPU-s), b 0-4 (4), c 7-10 (3): only a runs from 4 to 7
    results = tmp_path / "results" / "x"
    for rule, start, end, cpu in (("a", 0, 10, 9.0), ("b", 0, 4, 4.0), ("c", 7, 10, 3.0)):
        log = results / "logs" / rule / "job.log"
        log.parent.mkdir(parents=True)
        bench = write_job_bench(log, end - start, 1024, cpu)
        os.utime(bench, (1000 + end, 1000 + end))  # the file's mtime is the job's end
    jobs = study_timeline.read_jobs(results)
    assert sorted((round(s - 1000, 3), round(e - 1000, 3), r, c) for s, e, r, c in jobs) == [
        (0, 4, "b", 4.0), (0, 10, "a", 9.0), (7, 10, "c", 3.0)]
    got = study_timeline.packing(jobs, cores=2, step_s=0.01)
    assert got["span_s"] == 10 and got["cpu_s"] == 16.0 and got["idle_core_s"] == 4.0 and got["packing_pct"] == 80.0
    assert got["one_job_s"] == pytest.approx(3.0, abs=0.02)


def test_a_folder_without_benchmark_files_is_named(tmp_path):
    with pytest.raises(ValueError, match="no job benchmark files"):
        study_timeline.read_jobs(tmp_path)


def test_the_report_gemm_probe_is_the_one_thread_float32_row(tmp_path):
    results = tmp_path / "x"
    assert study_timeline.report_gemm_peak(results) is None  # no report yet
    (results / "report").mkdir(parents=True)
    (results / "report" / "efficiency.csv").write_text(
        "rule,threads,math,peak_gflop_per_s\n"
        "signature,,,\n"            # a rule that counts no FLOPs
        "pretrain,2,float32,167.9\n"  # two threads: not the one-thread probe
        "train,1,bfloat16,12.0\n"     # another math mode
        "train_private,1,float32,87.5\n")
    assert study_timeline.report_gemm_peak(results) == 87.5
