"""TAFT Fig. 4's quantity: the L2 distance of a trained model's tensors from their starting values,
against the distance of a known perturbation (nlft) and ‖Δw‖ (taft)."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.data.backbone import load_backbone, save_backbone
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.methods.weight_distance import distance_from_start, state_distance
from pipeline_src.store.model_io import save_model
from tests.conftest import tiny_vit


@pytest.mark.parametrize("method_cfg", [{"kind": "nlft", "k": 1}, {"kind": "taft", "k": 1}, {"kind": "fc"}])
def test_distance_of_a_known_perturbation(tmp_path, method_cfg):
    kwargs = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)
    save_backbone(tiny_vit().float(), {"vit_kwargs": kwargs, "mean": [0.5], "std": [0.5], "source": "test"},
                  tmp_path / "backbone")
    backbone, _ = load_backbone(tmp_path / "backbone")
    start = build_tuned_model(backbone, method_cfg, 5, 3).trainable_state()
    g = torch.Generator().manual_seed(0)
    moves = {k: 0.01 * torch.randn(v.shape, generator=g) for k, v in start.items()}
    want = sum(float(m.double().square().sum()) for m in moves.values()) ** 0.5
    save_model({k: start[k] + moves[k] for k in start},
               {"method_config": method_cfg, "num_classes": 5, "head_seed": 3}, tmp_path / "m.safetensors")
    assert distance_from_start(tmp_path / "backbone", tmp_path / "m.safetensors") == pytest.approx(want, rel=1e-5)
    assert state_distance(start, start) == 0.0
    if method_cfg["kind"] == "taft":  # the start is Δw ≈ 0: the distance is ‖Δw‖
        assert max(float(v.abs().max()) for v in start.values()) < 1e-6
    with pytest.raises(KeyError, match="lacks"):
        state_distance({"nope": torch.zeros(1)}, start)


def test_a_shared_start_is_built_once_and_keyed_by_head_seed(tmp_path):
    """The shard models of one job share their start (one head seed): with a `starts` cache the
    start is built once; a model of another head seed gets its own, and every distance is the one
    computed without the cache."""
    kwargs = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)
    save_backbone(tiny_vit().float(), {"vit_kwargs": kwargs, "mean": [0.5], "std": [0.5], "source": "test"},
                  tmp_path / "backbone")
    loaded = load_backbone(tmp_path / "backbone")
    cfg = {"kind": "nlft", "k": 1}
    g = torch.Generator().manual_seed(1)
    for i, seed in enumerate((3, 3, 4)):
        start = build_tuned_model(loaded[0], cfg, 5, seed).trainable_state()
        save_model({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in start.items()},
                   {"method_config": cfg, "num_classes": 5, "head_seed": seed}, tmp_path / f"m{i}.safetensors")
    starts: dict = {}
    cached = [distance_from_start(tmp_path / "backbone", tmp_path / f"m{i}.safetensors", backbone=loaded, starts=starts)
              for i in range(3)]
    fresh = [distance_from_start(tmp_path / "backbone", tmp_path / f"m{i}.safetensors") for i in range(3)]
    assert len(starts) == 2 and cached == fresh
