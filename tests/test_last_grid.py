"""LAST grid training (Tang et al. 2024): a vmapped grid equals each member trained alone."""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.last import (SideNetwork, batch_order, build_side_network, extract_feature_dict, train_side_grid,
                               train_side_network)


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
