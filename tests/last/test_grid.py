"""LAST grid training (Tang et al. 2024): the stacked low-rank forward equals each member's
SideNetwork (logits and gradients), B = 0 gives z_m, and a grid equals each member trained alone."""
import copy

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer
from torch.func import stack_module_state

from pipeline_src.last import (
    SideNetwork,
    batch_order,
    build_side_network,
    extract_feature_dict,
    extract_features,
    train_side_grid,
    train_side_network,
)
from pipeline_src.last.low_rank_stream import low_rank_representation, stacked_logits


@pytest.fixture(scope="module")
def data():
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=4,
                            num_heads=4).double()
    x = torch.randn(22, 1, 16, 16, dtype=torch.float64)
    return vit, extract_feature_dict(vit, x, every=1, chunk_size=8), torch.randint(0, 5, (22,))


MEMBERS = [  # two of one architecture (lr, seed, wd, zero init differ) and two others (g = depth, g = 1 with T = 2)
    dict(rank=8, heads=2, every=2, lr=1e-2, seed=1),
    dict(rank=8, heads=2, every=2, lr=3e-3, seed=2, weight_decay=0.1, zero_init_up=True),
    dict(rank=4, heads=4, every=4, modules_per_block=2, lr=1e-2, seed=3, bias_correction=False),
    dict(rank=6, heads=3, every=1, modules_per_block=2, lr=5e-3, seed=4, qkv_bias=False),
]


def test_grid_equals_members_alone(data):
    vit, feats, labels = data
    seen = []
    grid = train_side_grid(vit, feats, labels, MEMBERS, num_classes=5, epochs=2, batch_size=8, seed=7,
                           progress=lambda e, s, losses: seen.append((e, s, losses.shape)))
    assert seen[0] == (0, 0, (4,)) and seen[-1] == (1, 5, (4,))  # 3 steps per epoch
    for member, got in zip(MEMBERS, grid):
        alone = train_side_network(vit, feats, labels, member, num_classes=5, epochs=2, batch_size=8, seed=7)
        init = build_side_network(vit, member, num_classes=5).state_dict()
        assert got.keys() == alone.keys()
        assert max((alone[k] - init[k]).abs().max() for k in alone) > 1e-3  # training moved the weights
        for k in alone:
            torch.testing.assert_close(got[k], alone[k], rtol=0, atol=1e-9, msg=k)
        SideNetwork(vit, rank=member["rank"], heads=member["heads"], every=member["every"],
                    modules_per_block=member.get("modules_per_block", 1), num_classes=5,
                    bias_correction=member.get("bias_correction", True),
                    qkv_bias=member.get("qkv_bias", True)).load_state_dict(got)


def test_batch_order_is_per_epoch_permutation():
    order = batch_order(10, batch_size=4, epochs=2, seed=0)
    assert [len(b) for b in order] == [4, 4, 2, 4, 4, 2]
    assert sorted(torch.cat(order[:3]).tolist()) == list(range(10))
    assert all(torch.equal(a, b) for a, b in zip(order, batch_order(10, batch_size=4, epochs=2, seed=0)))


def test_grid_errors(data):
    vit, feats, labels = data
    sparse = {k: feats[k] for k in ("z0", "z2", "z4")}
    with pytest.raises(KeyError, match="z1"):
        train_side_grid(vit, sparse, labels, [dict(rank=4, heads=2, every=1)], num_classes=5, epochs=1,
                        batch_size=8, seed=0)
    with pytest.raises(ValueError, match="labels"):
        train_side_grid(vit, feats, labels[:5], [dict(rank=4, heads=2)], num_classes=5, epochs=1, batch_size=8, seed=0)
    with pytest.raises(ValueError, match="members is empty"):
        train_side_grid(vit, feats, labels, [], num_classes=5, epochs=1, batch_size=8, seed=0)


def stacked(nets: list[SideNetwork]) -> tuple[SideNetwork, dict]:
    """A meta skeleton and the members' stacked parameters (leaf tensors that require grad)."""
    params, buffers = stack_module_state(nets)
    return copy.deepcopy(nets[0]).to("meta"), {**params, **buffers}


def perturbed_nets(vit: VisionTransformer, n: int, **kw) -> list[SideNetwork]:
    """n side networks with every parameter moved off its init (LN affine, biases, B all non-trivial)."""
    nets = [SideNetwork(vit, num_classes=5, seed=s, **kw) for s in range(n)]
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for net in nets:
            for p in net.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return nets


@pytest.mark.parametrize("global_pool", ["token", "avg", "max"])
@pytest.mark.parametrize("every,T,rank,heads,qkv_bias,proj_bias,bias_correction", [
    (1, 1, 8, 2, True, True, True),
    (2, 2, 6, 3, False, True, False),
    (4, 3, 4, 1, True, False, True),
    (1, 2, 16, 4, False, False, True),
])
def test_stacked_forward_equals_each_network(global_pool, every, T, rank, heads, qkv_bias, proj_bias, bias_correction):
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=4, num_heads=4,
                            global_pool=global_pool).double()
    nets = perturbed_nets(vit, 3, rank=rank, heads=heads, every=every, modules_per_block=T, qkv_bias=qkv_bias,
                          proj_bias=proj_bias, bias_correction=bias_correction)
    feats = extract_features(vit, torch.randn(3, 1, 16, 16, dtype=torch.float64), every=every)
    base, state = stacked(nets)
    _, w, c = low_rank_representation(base, state, feats)
    k = 1 + (4 // every) * T * rank  # [e, B_1, ..., B_{mT}]
    assert w.shape == (3, 32, k) and c.shape == (3, 3, 17, k)
    got = stacked_logits(base, state, feats)
    ref = torch.stack([net(feats) for net in nets])
    assert got.shape == (3, 3, 5)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    weights = torch.randn(3, 3, 5, dtype=torch.float64)  # a loss that mixes logits differently per member
    (got * weights).sum().backward()
    (ref * weights).sum().backward()
    for j, net in enumerate(nets):
        for name, p in net.named_parameters():
            torch.testing.assert_close(state[name].grad[j], p.grad, rtol=1e-10, atol=1e-11, msg=name)


@pytest.mark.parametrize("every,T", [(1, 1), (2, 2), (4, 3)])
def test_stacked_zero_up_is_backbone(every, T):
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=4,
                            num_heads=4).double()
    feats = extract_features(vit, torch.randn(2, 1, 16, 16, dtype=torch.float64), every=every)
    for bias_correction, want in ((True, feats[-1]), (False, sum(feats))):
        nets = [SideNetwork(vit, rank=8, heads=2, every=every, modules_per_block=T, num_classes=5, zero_init_up=True,
                            bias_correction=bias_correction, seed=s) for s in range(2)]
        base, w, c = low_rank_representation(*stacked(nets), feats)
        torch.testing.assert_close(base + torch.einsum("mdk,mbnk->mbnd", w, c), want.expand(2, -1, -1, -1),
                                   rtol=0, atol=1e-12)


def test_stacked_forward_float32_at_vit_scale():
    """float32 with a ViT-like residual stream (large norm, two huge channels): the low-rank
    expansion of the LayerNorm variance is as accurate as the network's own float32 forward."""
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=32, patch_size=8, in_chans=3, num_classes=5, embed_dim=96, depth=6, num_heads=4)
    feats = extract_features(vit, torch.randn(4, 3, 32, 32), every=1)
    feats = [z * 20 + torch.zeros(96).index_fill_(0, torch.tensor([3, 40]), 300.0) for z in feats]
    nets = perturbed_nets(vit, 2, rank=16, heads=4, every=1, modules_per_block=1)
    with torch.no_grad():
        exact = torch.stack([copy.deepcopy(net).double()([z.double() for z in feats]) for net in nets])
        alone = torch.stack([net(feats) for net in nets])
        got = stacked_logits(*stacked(nets), feats)
    assert exact.abs().max() > 1  # the side stream moves the logits
    err_alone, err_got = ((t.double() - exact).abs().max().item() for t in (alone, got))
    assert err_got <= 4 * err_alone + 1e-6, (err_got, err_alone)


def test_grid_leaves_backbone_alone(data):
    vit, feats, labels = data
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    assert all(not z.requires_grad and z.grad_fn is None for z in feats.values())
    train_side_grid(vit, feats, labels, MEMBERS[:2], num_classes=5, epochs=1, batch_size=8, seed=0)
    assert all(torch.equal(before[k], v) for k, v in vit.state_dict().items())
    assert all(p.grad is None for p in vit.parameters())


def test_stacked_forward_refuses_an_ffn():
    """An FFN (the LAST Table 6 ablation) adds a non-linear D-wide term: no low-rank stream form."""
    vit = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                            num_heads=2).double()
    net = SideNetwork(vit, rank=4, heads=2, every=1, modules_per_block=1, num_classes=5, ffn_hidden=3)
    state = {k: v.unsqueeze(0) for k, v in net.state_dict().items()}
    feats = extract_features(vit, torch.randn(2, 1, 16, 16, dtype=torch.float64), every=1)
    with pytest.raises(ValueError, match="FFN"):
        stacked_logits(net, state, feats)
