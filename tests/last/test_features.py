"""LAST feature extraction (Tang et al. 2024): block outputs, no autograd graph, chunked cache."""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.last import extract_feature_dict, extract_features, feature_keys, side_inputs
from tests.conftest import tiny_vit


def hooked_block_io(vit: VisionTransformer, x: torch.Tensor) -> list[torch.Tensor]:
    """Reference: input of block 0 and output of every block, captured by hooks on the full forward."""
    got: list[torch.Tensor] = []
    hooks = [vit.blocks[0].register_forward_pre_hook(lambda m, a: got.append(a[0].detach().clone()))]
    hooks += [b.register_forward_hook(lambda m, a, o: got.append(o.detach().clone())) for b in vit.blocks]
    vit.eval()
    with torch.no_grad():
        vit(x)
    for h in hooks:
        h.remove()
    return got


@pytest.mark.parametrize("every", [1, 2, 4])
def test_features_are_block_outputs(every):
    vit = tiny_vit(depth=4)
    x = torch.randn(3, 1, 16, 16, dtype=torch.float64)
    ref = hooked_block_io(vit, x)  # [z_0, block1, ..., block4]
    feats = extract_features(vit, x, every=every)
    assert len(feats) == 4 // every + 1
    for i, z in enumerate(feats):
        torch.testing.assert_close(z, ref[i * every], rtol=0, atol=1e-12)
        assert z.shape == (3, 17, 32)


def test_no_graph_and_mode_restored():
    vit = tiny_vit(depth=4)
    vit.train()
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64, requires_grad=True)
    feats = extract_features(vit, x, every=1)
    assert all(not z.requires_grad and z.grad_fn is None for z in feats)
    assert vit.training
    assert all(p.grad is None for p in vit.parameters())


def test_feature_dict_chunks_match_single_pass():
    vit = tiny_vit(depth=4)
    x = torch.randn(7, 1, 16, 16, dtype=torch.float64)
    cache = extract_feature_dict(vit, x, every=2, chunk_size=3)
    assert list(cache) == ["z0", "z2", "z4"] == feature_keys(4, 2)
    for key, z in zip(cache, extract_features(vit, x, every=2)):
        torch.testing.assert_close(cache[key], z, rtol=0, atol=1e-12)
    full = extract_feature_dict(vit, x, every=1, chunk_size=4)
    picked = side_inputs(full, every=2, depth=4)  # an every=1 cache serves every=2
    for a, b in zip(picked, cache.values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_bad_options_raise():
    vit = tiny_vit(depth=4)
    x = torch.randn(1, 1, 16, 16, dtype=torch.float64)
    for every in (0, 3, 5, True):
        with pytest.raises(ValueError, match="every"):
            extract_features(vit, x, every=every)
    cache = extract_feature_dict(vit, x, every=2)
    with pytest.raises(KeyError, match="z1"):
        side_inputs(cache, every=1, depth=4)
