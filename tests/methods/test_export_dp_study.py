"""Exports of a DP study (docs/privacy.md, "The release boundary"): a non-DP model is refused
unless the flag that names it is passed, and every export is owner-only whatever the umask. On a
results folder laid out as a study writes it (real files, the real export CLI)."""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pipeline_src.methods.export import NON_PRIVATE_FLAG, export_model, main
from pipeline_src.plan.private_workspace import mark_dp_study

MEMBERS = ["digits/5/0001", "digits/6/0002"]
POOL = ["digits/1/0100", "digits/2/0200"]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)  # the usual umask: without the study's own modes, files 0644 and folders 0755
    yield
    os.umask(old)


def _study(root: Path, dp: bool) -> Path:
    """results/<experiment>/ with a backbone (recording an old-style pool digest) and one non-DP
    shard model whose record lists its members; returns the model's path."""
    results = root / "results" / "tiny"
    (results / "prepare").mkdir(parents=True)
    (results / "pretrain").mkdir()
    save_file({"w": torch.zeros(2)}, results / "pretrain" / "model.safetensors")
    digest = hashlib.sha256("\n".join(sorted(POOL)).encode()).hexdigest()
    (results / "pretrain" / "backbone.json").write_text(json.dumps(
        {"source": "pretrain", "pretrain_data": {"key": "pool/0", "count": 2, "ids_sha256": digest}}))
    model = results / "train" / "fc" / "n1_s0" / "shard0.safetensors"
    model.parent.mkdir(parents=True)
    save_file({"head.weight": torch.ones(2)}, model)
    model.with_suffix(".json").write_text(json.dumps({"kind": "train", "method": "fc", "sample_ids": MEMBERS}))
    if dp:
        mark_dp_study(results)
    return model


def _open_paths(folder: Path) -> list[str]:
    return [f"{p} {stat.S_IMODE(p.stat().st_mode):o}" for p in [folder, *folder.rglob("*")]
            if stat.S_IMODE(p.stat().st_mode) & 0o077]


def test_a_dp_studys_non_dp_model_is_refused_without_the_flag(tmp_path, umask_022, capsys):
    model = _study(tmp_path, dp=True)
    with pytest.raises(PermissionError, match=f"without differential privacy.*{NON_PRIVATE_FLAG}"):
        export_model(model, tmp_path / "out")
    assert main([str(model), str(tmp_path / "out")]) == 2
    assert NON_PRIVATE_FLAG in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))  # nothing written


def test_with_the_flag_it_exports_as_private_workspace_owner_only(tmp_path, umask_022, capsys):
    model = _study(tmp_path, dp=True)
    dest = tmp_path / "shared" / "out"
    assert main([str(model), str(dest), NON_PRIVATE_FLAG]) == 0
    assert "WARNING: PRIVATE WORKSPACE" in capsys.readouterr().err
    assert _open_paths(dest) == []
    assert (dest / "PRIVATE_WORKSPACE.txt").read_text().startswith("PRIVATE WORKSPACE")
    backbone = (dest / "backbone" / "backbone.json").read_text()
    assert "ids_sha256" not in backbone and '"count": 2' in backbone  # no unkeyed digest of the pool's ids


def test_a_non_dp_studys_export_is_unchanged(tmp_path, umask_022):
    model = _study(tmp_path, dp=False)
    dest = export_model(model, tmp_path / "out")
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755 and stat.S_IMODE((dest / "model.json").stat().st_mode) == 0o644
    assert not (dest / "PRIVATE_WORKSPACE.txt").exists()
    assert json.loads((dest / "model.json").read_text())["sample_ids"] == MEMBERS
    assert (dest / "backbone" / "backbone.json").read_bytes() == (
        tmp_path / "results/tiny/pretrain/backbone.json").read_bytes()


def test_a_study_from_before_the_mark_is_a_dp_study_by_its_dp_models(tmp_path, umask_022):
    model = _study(tmp_path, dp=False)
    (tmp_path / "results" / "tiny" / "private").mkdir()
    with pytest.raises(PermissionError):
        export_model(model, tmp_path / "out")
