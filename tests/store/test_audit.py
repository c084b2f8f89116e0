"""The audit on hand-made records: stale compositions name the ids and the component, fused
records' bare-path components are read, and paths resolve inside the model's own results tree."""
from __future__ import annotations

import json
from pathlib import Path

from pipeline_src.store.audit import audit_model


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
