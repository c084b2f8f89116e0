"""The audit on hand-made records: stale compositions name the ids and the component, fused
records' bare-path components are read, and paths resolve inside the model's own results tree."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline_src.store.audit import audit_model
from tests.conftest import REPO


def _write(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")  # the audit reads records only
    path.with_suffix(".json").write_text(json.dumps(record))
    return path


def _tree(root: Path, composed_ids: list[str], components) -> Path:
    _write(root / "results/train/m/n2_s0/shard0.safetensors", {"sample_ids": ["a", "b"]})
    _write(root / "results/train/m/n2_s0/shard1.safetensors", {"sample_ids": ["c"]})
    return _write(root / "results/compose/m/n2_s0/soup.safetensors",
                  {"sample_ids": composed_ids, "components": components})


def test_stale_composition_names_the_ids_and_the_component(tmp_path):
    comps = [{"path": f"results/train/m/n2_s0/shard{i}.safetensors", "shard_id": i} for i in range(2)]
    soup = _tree(tmp_path, ["a", "b"], comps)  # shard1 retrained on "c" after composing
    result = audit_model(soup, ["zzz"])
    assert not result.hits and len(result.stale) == 1
    path, why = result.stale[0]
    assert path == str(soup) and "shard1.safetensors" in why and "c" in why


def test_bare_path_components_and_resolution_inside_the_model_tree(tmp_path, monkeypatch):
    comps = [f"results/train/m/n2_s0/shard{i}.safetensors" for i in range(2)]  # fused records before the fix
    soup = _tree(tmp_path / "old_copy", ["a", "b", "c"], comps)
    _tree(tmp_path / "cwd", ["a", "b", "c"], comps)  # today's files in the cwd hold other ids
    (tmp_path / "cwd/results/train/m/n2_s0/shard1.json").write_text(json.dumps({"sample_ids": ["x"]}))
    monkeypatch.chdir(tmp_path / "cwd")
    result = audit_model(soup, ["c"])
    assert [p for p, _ in result.hits] == [str((tmp_path / "old_copy/results/train/m/n2_s0/shard1.safetensors"))]
    assert not result.stale


def test_stale_composition_names_the_component_whose_count_changed(tmp_path):
    """A shard retrained without a forgotten id after composing (issue 24, item 5): the composed
    record's component list says how many samples each component had then."""
    comps = [{"path": f"results/train/m/n2_s0/shard{i}.safetensors", "shard_id": i, "num_samples": n}
             for i, n in ((0, 2), (1, 2))]
    soup = _tree(tmp_path, ["a", "b", "c", "forgotten"], comps)  # shard1 had c and "forgotten"
    result = audit_model(soup, ["zzz"])
    (path, why), = result.stale
    assert "shard1.safetensors trained on 2 samples when composed, 1 now" in why
    assert "shard0" not in why  # its count did not change
    assert "no component trains on now (held then by " in why and why.endswith(": forgotten")


def test_a_copy_outside_its_results_folder_gets_a_one_line_error(tmp_path):
    comps = [{"path": f"results/train/m/n2_s0/shard{i}.safetensors", "shard_id": i, "num_samples": 1}
             for i in range(2)]
    soup = _tree(tmp_path / "study", ["a", "b", "c"], comps)
    kept = tmp_path / "kept"  # the user copied the model and its record elsewhere
    kept.mkdir()
    for f in (soup, soup.with_suffix(".json")):
        shutil.copy(f, kept / f.name)
    proc = subprocess.run([sys.executable, "-m", "pipeline_src.store.audit", str(kept / soup.name), "a"],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("audit: component results/train/m/n2_s0/shard0.safetensors of ")
    assert "its own results folder" in proc.stderr


def test_a_composed_model_moved_out_of_the_old_layout_is_audited(tmp_path):
    """Issue 44, 5.3: after `move-old-layout` the records still name results/train/...; the audit
    ended in rc 2 ("is in no folder above it"). It reads them from the study's own folder."""
    from pipeline_src.plan.studies import move_old_layout

    comps = [{"path": f"results/train/m/n2_s0/shard{i}.safetensors", "shard_id": i, "num_samples": n}
             for i, n in ((0, 2), (1, 1))]
    _tree(tmp_path, ["a", "b", "c"], comps)  # the old layout: results/<step>/...
    (tmp_path / "results/prepare").mkdir()
    (tmp_path / "results/prepare/samples.parquet").write_bytes(b"")  # what marks an old layout
    move_old_layout("tiny", tmp_path)
    soup = tmp_path / "results/tiny/compose/m/n2_s0/soup.safetensors"
    proc = subprocess.run([sys.executable, "-m", "pipeline_src.store.audit", "--study", "tiny",
                           "compose/m/n2_s0/soup.safetensors", "c"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    assert f"TRAINED ON 1 of the ids: {tmp_path}/results/tiny/train/m/n2_s0/shard1.safetensors: c" in proc.stdout
    result = audit_model(soup, ["zzz"])
    assert result.clean and len(result.checked) == 3
