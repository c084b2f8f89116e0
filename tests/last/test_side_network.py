"""LAST side network (Tang et al. 2024): identity at B = 0, bias correction, LSA against SDPA,
per-head rotation symmetry, shapes, frozen backbone, option errors."""
import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.last import LowRankSelfAttention, SideNetwork, extract_features, normalize_member
from tests.conftest import tiny_vit


def last_block_output(vit: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    got = []
    h = vit.blocks[-1].register_forward_hook(lambda m, a, o: got.append(o))
    with torch.no_grad():
        vit(x)
    h.remove()
    return got[0]


@pytest.mark.parametrize("global_pool", ["token", "avg"])
@pytest.mark.parametrize("every,T", [(1, 1), (2, 2), (4, 1), (4, 3)])
def test_zero_up_is_backbone(every, T, global_pool):
    vit = tiny_vit(depth=4, global_pool=global_pool)
    x = torch.randn(3, 1, 16, 16, dtype=torch.float64)
    side = SideNetwork(vit, rank=8, heads=2, every=every, modules_per_block=T, num_classes=5, zero_init_up=True, seed=3)
    feats = extract_features(vit, x, every=every)
    torch.testing.assert_close(side.representation(feats), last_block_output(vit, x), rtol=0, atol=1e-12)
    side.head.load_state_dict(vit.head.state_dict())  # same head => same logits as the backbone
    with torch.no_grad():
        torch.testing.assert_close(side(feats), vit(x), rtol=0, atol=1e-12)


def test_without_bias_correction_sums_features():
    vit = tiny_vit(depth=4)
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    side = SideNetwork(vit, rank=8, heads=2, every=2, modules_per_block=1, num_classes=5,
                       zero_init_up=True, bias_correction=False)
    feats = extract_features(vit, x, every=2)
    torch.testing.assert_close(side.representation(feats), feats[0] + feats[1] + feats[2], rtol=0, atol=1e-12)
    random_up = SideNetwork(vit, rank=8, heads=2, every=2, modules_per_block=1, num_classes=5)
    assert (random_up.representation(feats) - feats[2]).abs().max() > 1e-3  # B != 0 changes it


@pytest.mark.parametrize("fused", [True, False])
def test_lsa_matches_reference(fused):
    torch.manual_seed(0)
    lsa = LowRankSelfAttention(32, 12, 3).double()
    lsa.fused_attn = fused
    lsa.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():
        lsa.a_q.bias.normal_()
        lsa.b.bias.normal_()
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    y = F.layer_norm(x, (32,), lsa.norm.weight, lsa.norm.bias, eps=1e-6)
    q, k, v = (lin(y).view(2, 17, 3, 4).transpose(1, 2) for lin in (lsa.a_q, lsa.a_k, lsa.a_v))
    o = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1) @ v  # scale 1/sqrt(r/n) = 1/2
    ref = x + lsa.b(o.transpose(1, 2).reshape(2, 17, 12))
    torch.testing.assert_close(lsa(x), ref, rtol=0, atol=1e-12)


def random_orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=gen))
    return q


def test_per_head_rotation_symmetry():
    torch.manual_seed(0)
    lsa = LowRankSelfAttention(32, 8, 2).double()
    lsa.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():
        for lin in (lsa.a_q, lsa.a_k, lsa.a_v):
            lin.weight.mul_(20)  # make attention far from uniform
            lin.bias.normal_()
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    ref = lsa(x)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for h in range(2):
            rows = slice(4 * h, 4 * h + 4)
            r_qk, r_v = random_orthogonal(4, gen), random_orthogonal(4, gen)
            for lin, r in ((lsa.a_q, r_qk), (lsa.a_k, r_qk), (lsa.a_v, r_v)):
                lin.weight[rows] = r @ lin.weight[rows]
                lin.bias[rows] = r @ lin.bias[rows]
            lsa.b.weight[:, rows] = lsa.b.weight[:, rows] @ r_v.T
        torch.testing.assert_close(lsa(x), ref, rtol=0, atol=1e-12)
        lsa.a_k.weight[:4] = random_orthogonal(4, gen) @ lsa.a_k.weight[:4]  # K alone: breaks it
        assert (lsa(x) - ref).abs().max() > 1e-6


@pytest.mark.parametrize("every,T,rank,heads", [(1, 1, 4, 1), (1, 2, 8, 4), (2, 1, 6, 3), (4, 2, 16, 2)])
def test_shapes(every, T, rank, heads):
    vit = tiny_vit(depth=4)
    side = SideNetwork(vit, rank=rank, heads=heads, every=every, modules_per_block=T, num_classes=7)
    assert len(side.blocks) == 4 // every and all(len(b) == T for b in side.blocks)
    lsa = side.blocks[0][0]
    assert lsa.a_q.weight.shape == (rank, 32) and lsa.b.weight.shape == (32, rank)
    feats = extract_features(vit, torch.randn(5, 1, 16, 16, dtype=torch.float64), every=every)
    assert side(feats).shape == (5, 7) and side(feats).dtype == torch.float64


def test_backbone_gets_no_gradient():
    vit = tiny_vit(depth=4)
    assert all(p.requires_grad for p in vit.parameters())
    x = torch.randn(4, 1, 16, 16, dtype=torch.float64)
    feats = extract_features(vit, x, every=2)
    assert all(z.grad_fn is None and not z.requires_grad for z in feats)
    side = SideNetwork(vit, rank=8, heads=2, every=2, modules_per_block=1, num_classes=5)
    assert not any(p is q for p in side.parameters() for q in vit.parameters())
    F.cross_entropy(side(feats), torch.tensor([0, 1, 2, 3])).backward()
    assert all(p.grad is None for p in vit.parameters())
    assert all(p.grad is not None for p in side.parameters())


def test_bad_options_raise():
    vit = tiny_vit(depth=4)
    kw = dict(rank=8, heads=2, every=2, modules_per_block=1, num_classes=5)
    with pytest.raises(ValueError, match="rank=6 must be a positive multiple of heads=4"):
        SideNetwork(vit, **{**kw, "rank": 6, "heads": 4})
    with pytest.raises(ValueError, match="every=3"):
        SideNetwork(vit, **{**kw, "every": 3})
    with pytest.raises(ValueError, match="modules_per_block"):
        SideNetwork(vit, **{**kw, "modules_per_block": 0})
    side = SideNetwork(vit, **kw)
    feats = extract_features(vit, torch.randn(1, 1, 16, 16, dtype=torch.float64), every=1)
    with pytest.raises(ValueError, match="expected 3 feature tensors"):
        side(feats)
    with pytest.raises(NotImplementedError, match="attention-pooling"):
        SideNetwork(tiny_vit(depth=2, global_pool="map"), **kw)
    with pytest.raises(ValueError, match="unknown keys \\['rnak'\\]"):
        normalize_member({"rank": 8, "heads": 2, "rnak": 3})
    with pytest.raises(ValueError, match="missing required keys \\['heads'\\]"):
        normalize_member({"rank": 8})


def test_ffn_ablation_matches_reference_and_zero_init_keeps_identity():
    """LAST Table 6's ablation: an LSA module with a small FFN, y + fc2(GELU(fc1(LN(y)))) after the
    attention residual y; with zero_init_up both B and fc2 start at 0, so the module is the identity."""
    lsa = LowRankSelfAttention(32, 12, 3, ffn_hidden=8).double()
    lsa.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():
        lsa.fc1.bias.normal_(), lsa.fc2.bias.normal_(), lsa.ffn_norm.weight.normal_()
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    plain = LowRankSelfAttention(32, 12, 3).double()
    plain.load_state_dict({k: v for k, v in lsa.state_dict().items() if k in plain.state_dict()})
    y = plain(x)  # the paper's LSA, same attention weights
    ffn = lsa.fc2(F.gelu(lsa.fc1(F.layer_norm(y, (32,), lsa.ffn_norm.weight, lsa.ffn_norm.bias, eps=1e-6))))
    torch.testing.assert_close(lsa(x), y + ffn, rtol=0, atol=1e-12)
    assert ffn.abs().max() > 1e-3
    vit = tiny_vit(depth=4)
    x = torch.randn(3, 1, 16, 16, dtype=torch.float64)
    side = SideNetwork(vit, rank=8, heads=2, every=2, modules_per_block=2, num_classes=5, zero_init_up=True,
                       ffn_hidden=6, seed=3)
    d = vit.embed_dim  # 2 blocks x T = 2 modules, each LN-free fc1 (d -> 6) and fc2 (6 -> d)
    assert sum(p.numel() for n, p in side.named_parameters() if ".fc" in n) == 4 * (d * 6 + 6 + 6 * d + d)
    feats = extract_features(vit, x, every=2)
    torch.testing.assert_close(side.representation(feats), last_block_output(vit, x), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="ffn_hidden"):
        LowRankSelfAttention(32, 12, 3, ffn_hidden=-1)
