"""LAST grid attention paths (Tang et al. 2024): the chunked bmm path (FlashAttention-style
recomputation, Dao et al. 2022) equals SDPA in float64, forward and backward, and the stacked
grid forward gives the same logits and gradients on either path."""
import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.last import SideNetwork, extract_features
from pipeline_src.last import small_head_attention as sha
from pipeline_src.last.low_rank_stream import stacked_logits
from tests.last.test_grid import perturbed_nets, stacked


@pytest.mark.parametrize("shape,chunk", [((3, 2, 9, 4), 1), ((5, 4, 17, 4), 3), ((2, 1, 7, 8), 64)])
def test_bmm_attention_equals_sdpa(shape, chunk):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    weights = torch.randn(shape, generator=gen, dtype=torch.float64)
    scale = shape[-1] ** -0.5
    ref = F.scaled_dot_product_attention(q, k, v, scale=scale)
    got = sha.bmm_attention(q, k, v, scale, chunk=chunk)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-13)
    g_ref = torch.autograd.grad((ref * weights).sum(), [q, k, v])
    g_got = torch.autograd.grad((got * weights).sum(), [q, k, v])
    for a, b, name in zip(g_got, g_ref, "qkv"):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)


def test_path_table_and_errors():
    q = torch.randn(1, 1, 3, 4)
    assert sha.ATTENTION_PATH["cpu"] == "sdpa"  # measured (module docstring)
    with pytest.raises(ValueError, match="'flash'"):
        sha.attention(q, q, q, 0.5, path="flash")


def test_grid_forward_same_on_both_paths(monkeypatch):
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=4,
                            num_heads=4).double()
    nets = perturbed_nets(vit, 3, rank=8, heads=2, every=2, modules_per_block=2)
    feats = extract_features(vit, torch.randn(3, 1, 16, 16, dtype=torch.float64), every=2)
    weights = torch.randn(3, 3, 5, dtype=torch.float64)
    out = {}
    for path in ("sdpa", "bmm"):
        monkeypatch.setitem(sha.ATTENTION_PATH, "cpu", path)
        base, state = stacked(nets)
        logits = stacked_logits(base, state, feats)
        (logits * weights).sum().backward()
        out[path] = logits, {k: v.grad for k, v in state.items() if v.grad is not None}
    torch.testing.assert_close(out["bmm"][0], out["sdpa"][0], rtol=0, atol=1e-12)
    assert out["bmm"][1].keys() == out["sdpa"][1].keys() and len(out["sdpa"][1]) > 10
    for name, g in out["sdpa"][1].items():
        torch.testing.assert_close(out["bmm"][1][name], g, rtol=1e-10, atol=1e-11, msg=name)
    assert isinstance(nets[0], SideNetwork)
