"""`train.schedule` in every training loop: `fit`, `train_tangent` and `train_side_network` against
the same loop written with torch.optim.lr_scheduler (float64, same batches), and the vectorized
loops (TAFT shards of unequal sizes, the LAST grid) against their members trained alone."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.last import extract_feature_dict, train_side_grid, train_side_network
from pipeline_src.last.features import side_inputs
from pipeline_src.last.train import build_side_network
from pipeline_src.methods.training import fit
from pipeline_src.taft import TangentViT, train_tangent, train_tangent_vectorized
from pipeline_src.taft.losses import get_loss
from pipeline_src.taft.train import tangent_step

pytestmark = pytest.mark.usefixtures("float64_default")
STEP = {"name": "step", "milestones": [1, 2], "factor": 0.1}
COSINE = {"name": "cosine", "warmup_epochs": 1, "min_factor": 0.1}


def torch_scheduler(opt, schedule: dict, spe: int, epochs: int):
    """(scheduler, steps between its .step() calls) of torch for our schedule."""
    if schedule["name"] == "step":
        return torch.optim.lr_scheduler.MultiStepLR(opt, schedule["milestones"], gamma=schedule["factor"]), spe
    warm, total = schedule["warmup_epochs"] * spe, epochs * spe
    lr0 = opt.param_groups[0]["lr"]
    return torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / warm, end_factor=1.0, total_iters=warm - 1),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warm, eta_min=lr0 * schedule["min_factor"])],
        milestones=[warm]), 1


@pytest.mark.parametrize("schedule", [STEP, COSINE])
def test_fit_equals_torch_scheduler(schedule):
    torch.manual_seed(0)
    x, y = torch.randn(20, 6), torch.randint(0, 3, (20,))
    ours, ref = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    ref.load_state_dict(ours.state_dict())
    fit(ours, list(ours.parameters()), x, y, epochs=3, batch_size=7, lr=0.1, weight_decay=0.01, seed=4,
        schedule=schedule)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.1, weight_decay=0.01)
    sched, every = torch_scheduler(opt, schedule, 3, 3)
    gen, t = torch.Generator().manual_seed(4), 0
    for _ in range(3):
        order = torch.randperm(20, generator=gen)
        for start in range(0, 20, 7):
            idx = order[start:start + 7]
            opt.zero_grad()
            F.cross_entropy(ref(x[idx]), y[idx]).backward()
            opt.step()
            t += 1
            if t % every == 0:
                sched.step()
    torch.testing.assert_close(ours.weight, ref.weight, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.bias, ref.bias, rtol=1e-10, atol=1e-12)
    torch.manual_seed(0)
    const = torch.nn.Linear(6, 3)  # the same init, constant lr: a different model (the schedule acts)
    fit(const, list(const.parameters()), x, y, epochs=3, batch_size=7, lr=0.1, weight_decay=0.01, seed=4)
    assert (const.weight - ours.weight).abs().max() > 1e-3


def _tangent():
    torch.manual_seed(0)
    base = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                             num_heads=4, qkv_bias=False).eval()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(30, 1, 16, 16, generator=g), torch.randint(0, 5, (30,), generator=g)

    def model():
        return TangentViT(base, 1, reset=True, reset_seed=1, delta_init_std=1e-3)
    m = model()
    return model, m.prefix(x), y


@pytest.mark.parametrize("schedule", [STEP, COSINE])
def test_train_tangent_equals_torch_scheduler_and_vectorized_follows_each_shard(schedule):
    model, feats, y = _tangent()
    ours = model()
    train_tangent(ours, feats, y, epochs=3, batch_size=8, lr=2e-2, loss="ce", seed=5, schedule=schedule)
    ref = model()
    opt = torch.optim.AdamW(ref.delta_parameters(), lr=2e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched, every = torch_scheduler(opt, schedule, 4, 3)
    gen, t = torch.Generator().manual_seed(5), 0
    for _ in range(3):
        perm = torch.randperm(30, generator=gen)
        for start in range(0, 30, 8):
            idx = perm[start:start + 8]
            tangent_step(ref, opt, feats[idx], y[idx], get_loss("ce"))
            t += 1
            if t % every == 0:
                sched.step()
    for (n, p), q in zip(ours.named_delta_parameters(), ref.delta_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=n)
    # shards of 11 and 19 samples: 3 and 5 steps per epoch, each on its own schedule
    shards = [(feats[:11], y[:11]), (feats[11:], y[11:])]
    kw = dict(epochs=3, batch_size=4, lr=2e-2, loss="ce", schedule=schedule)
    vec = train_tangent_vectorized(model(), shards, seed=[1, 2], **kw)
    for (f, lab), s, v in zip(shards, [1, 2], vec):
        alone = train_tangent(model(), f, lab, seed=s, **kw)["delta_state_dict"]
        for n, p in alone.items():
            torch.testing.assert_close(v["delta_state_dict"][n], p, rtol=1e-8, atol=1e-11, msg=n)


@pytest.mark.parametrize("schedule", [STEP, COSINE])
def test_side_network_equals_torch_scheduler_and_grid_follows(schedule):
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                            num_heads=4).double()
    x, y = torch.randn(18, 1, 16, 16, dtype=torch.float64), torch.randint(0, 5, (18,))
    feats = extract_feature_dict(vit, x, every=1, chunk_size=8)
    members = [dict(rank=8, heads=2, every=1, lr=1e-2, seed=1), dict(rank=8, heads=2, every=1, lr=3e-3, seed=2,
                                                                      weight_decay=0.1)]
    kw = dict(num_classes=5, epochs=3, batch_size=7, seed=3, schedule=schedule)
    grid = train_side_grid(vit, feats, y, members, **kw)
    for member, got in zip(members, grid):
        alone = train_side_network(vit, feats, y, member, **kw)
        for k in alone:
            torch.testing.assert_close(got[k], alone[k], rtol=0, atol=1e-9, msg=k)
    m = members[1]
    net = build_side_network(vit, m, num_classes=5)
    opt = torch.optim.AdamW(net.parameters(), lr=m["lr"], weight_decay=m["weight_decay"])
    sched, every = torch_scheduler(opt, schedule, 3, 3)
    zs = side_inputs(feats, every=1, depth=2)
    from pipeline_src.last import batch_order
    for t, idx in enumerate(batch_order(18, batch_size=7, epochs=3, seed=3), 1):
        opt.zero_grad()
        F.cross_entropy(net([z[idx] for z in zs]), y[idx]).backward()
        opt.step()
        if t % every == 0:
            sched.step()
    for k, v in net.state_dict().items():
        torch.testing.assert_close(alone[k], v, rtol=1e-9, atol=1e-12, msg=k)
