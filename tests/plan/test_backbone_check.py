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


@pytest.mark.parametrize("overrides, message", [
    ({"mlp_ratio": 2.0}, r"tensor 'blocks\.0\.mlp\.fc1\.weight' has shape \[64, 32\], backbone\.arch needs \[128, 32\] \(mlp_ratio"),
    ({"patch_size": 8}, r"tensor 'patch_embed\.proj\.weight' has shape \[32, 1, 8, 8\], backbone\.arch needs \[32, 1, 4, 4\] "
                        r"\(patch_size"),
    ({"in_chans": 3}, r"tensor 'patch_embed\.proj\.weight' has shape \[32, 3, 4, 4\].*dataset\.in_chans"),
    ({"qkv_bias": False}, r"has no 'blocks\.0\.attn\.qkv\.bias', backbone\.arch\.qkv_bias is True"),
    ({"class_token": False, "global_pool": "avg"}, r"has no 'cls_token', backbone\.arch\.class_token is True"),
    ({"init_values": 1e-5}, r"has a LayerScale 'blocks\.0\.ls1\.gamma', backbone\.arch\.init_values is None"),
])
def test_a_checkpoint_of_another_architecture_is_refused_at_validation(tmp_path, overrides, message):
    """Same depth and width as backbone.arch, another shape (issue 33, item 4): refused from the header alone."""
    path = tmp_path / "other.safetensors"
    save_file(tiny_vit(**overrides).float().state_dict(), str(path))
    with pytest.raises(ConfigError, match=r"config key 'backbone\.checkpoint': .*other\.safetensors: " + message):
        validate(source="checkpoint", checkpoint=str(path))


def test_a_recorded_head_count_is_checked(tmp_path, good_safetensors):
    """tiny_vit has 4 heads, as ARCH: shapes cannot tell 2 heads from 4, a record can."""
    validate(source="checkpoint", checkpoint=str(good_safetensors))
    with_meta = tmp_path / "meta.safetensors"
    save_file(tiny_vit().float().state_dict(), str(with_meta), metadata={"num_heads": "2"})
    with pytest.raises(ConfigError, match=r"its metadata records num_heads 2, backbone\.arch\.num_heads is 4"):
        validate(source="checkpoint", checkpoint=str(with_meta))
    (tmp_path / "vit.json").write_text('{"vit_kwargs": {"num_heads": 2}}')  # the record beside the good file
    with pytest.raises(ConfigError, match=r"vit\.json records num_heads 2"):
        validate(source="checkpoint", checkpoint=str(good_safetensors))
    (tmp_path / "vit.json").write_text('{"vit_kwargs": {"num_heads": 4}}')
    validate(source="checkpoint", checkpoint=str(good_safetensors))
