"""A broken result file (issue 44, 5.4): the views name it and the query still answers from the
other files, and `check_outputs --rebuild` has the next run rebuild it and the deleted ones
(real DuckDB, real Parquet, Snakemake's metadata record layout)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from base64 import urlsafe_b64encode
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_src.plan.run_start import killed_rebuilds
from pipeline_src.store.check_outputs import check_outputs, rebuild
from pipeline_src.store.results_db import UnreadableResults, connect
from tests.conftest import REPO

STUDY = "results/tiny"
METRICS = [f"{STUDY}/metrics/evaluate/fc/n{n}_s0/shards.parquet" for n in (1, 2, 3)]


def _record(workdir: Path, output: str) -> None:
    """Snakemake's metadata record of an output it built (`persistence`: the path in urlsafe base64)."""
    path = workdir / ".snakemake" / "metadata" / urlsafe_b64encode(output.encode()).decode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rule": "evaluate_shards"}))


def _study(workdir: Path) -> Path:
    """Three metrics files of 2 rows each and a samples table, each with its record; the second
    metrics file cut in half (a copy cut short)."""
    for i, f in enumerate(METRICS):
        (workdir / f).parent.mkdir(parents=True)
        pq.write_table(pa.table({"experiment": ["tiny"] * 2, "metric": ["accuracy"] * 2, "value": [i, i + 0.5]}),
                       workdir / f)
        _record(workdir, f)
    (workdir / STUDY / "prepare").mkdir()
    pq.write_table(pa.table({"sample_id": ["a", "b", "c"]}), workdir / STUDY / "prepare" / "samples.parquet")
    broken = workdir / METRICS[1]
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    return broken


def test_a_broken_metrics_file_is_named_and_the_others_still_answer(tmp_path, monkeypatch):
    broken = _study(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnreadableResults, match=f"view 'metrics' in {STUDY}/: {METRICS[1]} \\(") as err:
        connect(STUDY)  # the report's connection refuses by name: a table would silently miss rows
    assert "check_outputs --results results/tiny --rebuild" in str(err.value)
    warnings: list[str] = []
    con = connect(STUDY, warn=warnings.append)
    assert con.sql("SELECT count(*), sum(value) FROM metrics").fetchall() == [(4, pytest.approx(0 + 0.5 + 2 + 2.5))]
    assert con.sql("SELECT count(*) FROM samples").fetchall() == [(3,)]
    assert len(warnings) == 1 and METRICS[1] in warnings[0] and "leaves them out" in warnings[0]
    # the command line: one warning line naming the file, then the answer, exit 0 (was a 17-line traceback)
    proc = subprocess.run([sys.executable, "-m", "pipeline_src.store.query", "--study", "tiny", "--format", "csv",
                           "SELECT count(*) AS n FROM samples"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.split() == ["n", "3"], proc.stderr
    assert proc.stderr.startswith("query: warning: 1 unreadable file(s)") and str(METRICS[1]) in proc.stderr
    assert "Traceback" not in proc.stderr and broken.exists()


def test_check_outputs_has_the_next_run_rebuild_broken_and_deleted_outputs(tmp_path, monkeypatch):
    _study(tmp_path)
    monkeypatch.chdir(tmp_path)
    os.unlink(METRICS[2])  # deleted: Snakemake alone would say "Nothing to be done"
    (tmp_path / STUDY / "logs").mkdir()
    (tmp_path / STUDY / "logs" / "x.counters.parquet").write_bytes(b"PAR1 cut")  # broken, no output of a rule
    found = check_outputs(STUDY)
    assert list(found.broken) == [METRICS[1]] and found.missing == [METRICS[2]]
    assert list(found.unowned) == [f"{STUDY}/logs/x.counters.parquet"]
    assert killed_rebuilds(STUDY) == []
    assert rebuild(found) == sorted(METRICS[1:])
    assert not os.path.exists(METRICS[1]) and os.path.exists(METRICS[0])
    assert killed_rebuilds(STUDY) == sorted(METRICS[1:])  # the next plain run's `all` needs them
    proc = subprocess.run([sys.executable, "-m", "pipeline_src.store.check_outputs", "--study", "tiny"],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and f"MISSING {METRICS[1]}" in proc.stdout and f"MISSING {METRICS[2]}" in proc.stdout
