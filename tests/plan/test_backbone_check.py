"""A bad backbone fails at validation, naming the key (issue 15, item 2). The Snakemake run that
shows the previous backbone survives is in tests/e2e/test_reliability.py."""
from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
import torch
from safetensors.torch import save_file

from pipeline_src.plan.config import ConfigError, validate_config
from tests.conftest import REPO, tiny_vit

ARCH = {"patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 4.0}


def cfg_with(**backbone) -> dict:
    return {"experiment": "x", "dataset": {"img_size": 16}, "backbone": {"arch": ARCH, **backbone},
            "methods": {"fc": {"kind": "fc"}}, "shards": [1]}


def validate(**backbone) -> dict:
    return validate_config(cfg_with(**backbone), count_samples=False)


@pytest.fixture
def good_safetensors(tmp_path):
    path = tmp_path / "vit.safetensors"
    save_file(tiny_vit().float().state_dict(), str(path))
    return path


@pytest.fixture
def good_pth(tmp_path):
    path = tmp_path / "vit.pth"
    torch.save({"state_dict": tiny_vit().float().state_dict()}, path)
    return path


def test_good_checkpoints_pass(good_safetensors, good_pth):
    validate(source="checkpoint", checkpoint=str(good_safetensors))
    validate(source="checkpoint", checkpoint=str(good_pth))


@pytest.mark.parametrize("cut", [1, 100, 5000])
@pytest.mark.parametrize("fixture", ["good_safetensors", "good_pth"])
def test_a_truncated_checkpoint_names_the_key(request, tmp_path, fixture, cut):
    good = request.getfixturevalue(fixture)
    bad = tmp_path / f"cut{good.suffix}"
    bad.write_bytes(good.read_bytes()[:-cut])
    with pytest.raises(ConfigError, match=r"config key 'backbone\.checkpoint': .*cut.*(truncated|too short)"):
        validate(source="checkpoint", checkpoint=str(bad))


@pytest.mark.parametrize("content", [b"", b"\x05\x00", b"not a checkpoint at all, just text", b"\xff" * 64])
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_garbage_names_the_key(tmp_path, content, suffix):
    bad = tmp_path / f"garbage{suffix}"
    bad.write_bytes(content)
    with pytest.raises(ConfigError, match=r"config key 'backbone\.checkpoint'"):
        validate(source="checkpoint", checkpoint=str(bad))


def test_a_zip_without_torch_data_is_refused(tmp_path):
    bad = tmp_path / "x.pth"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(ConfigError, match="data.pkl"):
        validate(source="checkpoint", checkpoint=str(bad))


def test_safetensors_without_vit_keys_or_of_another_depth(tmp_path):
    other = tmp_path / "other.safetensors"
    save_file({"encoder.weight": torch.zeros(3, 3)}, str(other))
    with pytest.raises(ConfigError, match=r"'backbone\.checkpoint'.*patch_embed\.proj\.weight"):
        validate(source="checkpoint", checkpoint=str(other))
    deeper = tmp_path / "deeper.safetensors"
    save_file(tiny_vit(depth=3).float().state_dict(), str(deeper))
    with pytest.raises(ConfigError, match=r"'backbone\.checkpoint'.*backbone\.arch\.depth is 2"):
        validate(source="checkpoint", checkpoint=str(deeper))
    wider = tmp_path / "wider.safetensors"
    save_file(tiny_vit(embed_dim=48).float().state_dict(), str(wider))
    with pytest.raises(ConfigError, match=r"backbone\.arch\.embed_dim is 32"):
        validate(source="checkpoint", checkpoint=str(wider))


@pytest.mark.parametrize("source", ["timm", "checkpoint"])
def test_an_unknown_timm_name_names_the_key(good_safetensors, source):
    with pytest.raises(ConfigError, match=r"config key 'backbone\.timm_name': 'vit_nonexistent_patch16' is not"):
        validate(source=source, timm_name="vit_nonexistent_patch16", checkpoint=str(good_safetensors))
    validate(source="timm", timm_name="vit_tiny_patch16_224.augreg_in21k")  # a pretrained tag is fine


def test_the_default_study_validates_without_importing_torch_or_timm():
    code = ("import sys, yaml; from pipeline_src.plan.config import validate_config; "
            f"validate_config(yaml.safe_load(open({str(REPO / 'config.yaml')!r})), count_samples=False); "
            "print(sorted(m for m in ('torch', 'timm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
