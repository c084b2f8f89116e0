"""The Snakemake process's collector is tuned at the parse (`plan/scheduler_gc.py`), and still
collects reference cycles. Each check runs in a fresh interpreter: the tuning is process-wide."""
from __future__ import annotations

import json
import subprocess
import sys

from pipeline_src.plan.scheduler_gc import OLDER_THRESHOLDS, YOUNG_THRESHOLD
from tests.conftest import REPO
from tests.plan.parsed_workflow import in_parsed_workflow

TUNED = [YOUNG_THRESHOLD, *OLDER_THRESHOLDS]


def test_parsing_the_workflow_tunes_the_main_process(tmp_path):
    out = in_parsed_workflow(tmp_path, 'import gc\nprint(json.dumps({"thresholds": gc.get_threshold(), '
                                       '"frozen": gc.get_freeze_count()}))\n')
    assert out["thresholds"] == TUNED
    assert out["frozen"] > 10_000  # the modules alive at the parse: Snakemake's, this package's


CYCLES = """
import gc, json, weakref
from pipeline_src.plan.scheduler_gc import tune_collector

class Node:
    pass

thresholds = tune_collector()
freed = []
for i in range(400_000):  # about 8 times the young threshold in container allocations
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: reference counting alone never frees it
    if i % 1000 == 0:
        weakref.finalize(a, freed.append, i)
    del a, b
print(json.dumps({"thresholds": thresholds, "freed": len(freed), "enabled": gc.isenabled()}))
"""


def test_tuned_collector_still_frees_reference_cycles_without_an_explicit_collect():
    proc = subprocess.run([sys.executable, "-c", CYCLES], cwd=REPO, capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    assert out["thresholds"] == TUNED and out["enabled"]
    # 400 watched cycles; young collections free those made before the last one (untuned: almost all)
    assert out["freed"] >= 300, out
