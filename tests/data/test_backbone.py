import pytest
import torch
from safetensors.torch import save_file

from pipeline_src.data.backbone import external_backbone, load_backbone, save_backbone
from pipeline_src.plan.config import validate_config
from tests.conftest import tiny_vit


def checkpoint_cfg(path, **backbone):
    return validate_config({
        "experiment": "x", "dataset": {"img_size": 16},
        "backbone": {"source": "checkpoint", "checkpoint": str(path),
                     "arch": {"patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 4.0},
                     **backbone},
        "methods": {"fc": {"kind": "fc"}}, "shards": [1]}, count_samples=False)


@pytest.mark.parametrize("fmt", ["safetensors", "pth"])
def test_checkpoint_round_trip(tmp_path, fmt):
    src = tiny_vit().float()
    path = tmp_path / f"ckpt.{fmt}"
    if fmt == "safetensors":
        save_file(src.state_dict(), str(path))
    else:
        torch.save({"state_dict": src.state_dict()}, path)
    model, record = external_backbone(checkpoint_cfg(path))
    x = torch.randn(3, 1, 16, 16)
    assert torch.allclose(model.forward_features(x), src.forward_features(x))
    save_backbone(model, record, tmp_path / "stored")
    again, _ = load_backbone(tmp_path / "stored")
    assert torch.equal(again.forward_features(x), model.forward_features(x))


def test_checkpoint_with_wrong_architecture_fails(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file(tiny_vit(depth=3).float().state_dict(), str(path))
    with pytest.raises(ValueError, match="unexpected keys|backbone.arch.depth"):  # now at validation
        external_backbone(checkpoint_cfg(path))


def test_pickled_code_is_refused(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": object()}}, path)
    with pytest.raises(Exception, match="[Ww]eights.only"):  # torch.load(weights_only=True) refuses it
        external_backbone(checkpoint_cfg(path))


def test_timm_name_builds_the_named_architecture(tmp_path):
    cfg = validate_config({"experiment": "x", "dataset": {"img_size": 224, "in_chans": 3},
                           "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224", "pretrained": False},
                           "methods": {"fc": {"kind": "fc"}}, "shards": [1]}, count_samples=False)
    model, record = external_backbone(cfg)
    assert record["timm_name"] == "vit_tiny_patch16_224" and model.embed_dim == 192
    assert len(record["mean"]) == 3


def timm_cfg(img_size: int, in_chans: int = 3):
    return validate_config({"experiment": "x", "dataset": {"img_size": img_size, "in_chans": in_chans},
                            "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224", "pretrained": False},
                            "methods": {"fc": {"kind": "fc"}}, "shards": [1]}, count_samples=False)


def test_a_timm_backbone_is_built_at_the_studys_image_size_and_channels(tmp_path):
    default, _ = external_backbone(timm_cfg(224))
    model, record = external_backbone(timm_cfg(32, in_chans=1))
    assert default.pos_embed.shape == (1, 197, 192)  # the name's own size: 14 x 14 patches + CLS
    assert model.pos_embed.shape == (1, 5, 192) and model.patch_embed.proj.weight.shape == (192, 1, 16, 16)
    assert model.forward_features(torch.randn(2, 1, 32, 32)).shape == (2, 5, 192)
    assert record["create_kwargs"] == {"img_size": 32, "in_chans": 1}
    save_backbone(model, record, tmp_path / "stored")  # the pretrain step's files rebuild it at that size
    again, _ = load_backbone(tmp_path / "stored")
    x = torch.randn(2, 1, 32, 32)
    assert torch.equal(again.forward_features(x), model.forward_features(x))
    with pytest.raises(ValueError, match="'dataset.img_size': 40 is not a multiple of the patch size"):
        external_backbone(timm_cfg(40))


def test_a_checkpoint_of_another_size_gets_its_position_embedding_resampled(tmp_path):
    from timm.layers import resample_abs_pos_embed

    src = tiny_vit(img_size=8).float()  # 2 x 2 patches of 4 px
    path = tmp_path / "small.safetensors"
    save_file(src.state_dict(), str(path))
    model, _ = external_backbone(checkpoint_cfg(path))  # built at 16 px: 4 x 4 patches
    expected = resample_abs_pos_embed(src.pos_embed.detach(), new_size=[4, 4], num_prefix_tokens=1)
    assert model.pos_embed.shape == (1, 17, src.embed_dim) and torch.equal(model.pos_embed.detach(), expected)
