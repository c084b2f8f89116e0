"""Soup, Fisher-weighted averaging and RegMean against explicit references (float64)."""
from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pipeline_src.fusion import (
    diagonal_fisher,
    fisher_merge,
    fuse,
    linear_input_grams,
    register,
    regmean_merge,
    weighted_average,
)
from pipeline_src.matching import match_to_anchor


def make_vit(seed: int, num_heads: int = 4, qkv_bias: bool = True) -> VisionTransformer:
    torch.manual_seed(seed)
    m = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2,
                          num_heads=num_heads, qkv_bias=qkv_bias).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return m


def images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def assert_sd_close(a: dict, b: dict, tol: float = 1e-8) -> None:
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=tol, atol=tol, msg=k)


def test_soup_mean_and_self():
    sds = [make_vit(s).state_dict() for s in (0, 1, 2)]
    out = weighted_average(sds)
    for k in sds[0]:
        torch.testing.assert_close(out[k], (sds[0][k] + sds[1][k] + sds[2][k]) / 3)
    assert_sd_close(weighted_average([sds[0], sds[0]]), sds[0])
    with pytest.raises(ValueError, match="weights"):
        weighted_average(sds, weights=[1.0, -1.0, 1.0])


@pytest.mark.parametrize("use_labels", [True, False])
def test_fisher_against_single_example_backward(use_labels):
    model = make_vit(3)
    x, y = images(5, 0), torch.tensor([0, 3, 1, 4, 2])
    fisher = diagonal_fisher(model, x, y if use_labels else None, batch_size=2)
    ref = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(5):
        model.zero_grad()
        logits = model(x[i:i + 1])
        label = y[i] if use_labels else logits.argmax(-1)[0]
        torch.log_softmax(logits, -1)[0, label].backward()
        for n, p in model.named_parameters():
            ref[n] += p.grad ** 2 / 5
    assert_sd_close(fisher, ref, 1e-9)
    assert sum(float(f.sum()) for f in fisher.values()) > 0


def test_fisher_merge_formula_and_self():
    sds = [make_vit(s).state_dict() for s in (4, 5)]
    gen = torch.Generator().manual_seed(0)
    fishers = [{k: torch.rand(v.shape, generator=gen, dtype=torch.float64) for k, v in sds[0].items()
                if k.startswith("blocks.")} for _ in sds]
    out = fisher_merge(sds, fishers, eps=1e-3)
    for k in sds[0]:
        if k in fishers[0]:
            f0, f1 = fishers[0][k] + 1e-3, fishers[1][k] + 1e-3
            ref = (f0 * sds[0][k] + f1 * sds[1][k]) / (f0 + f1)
        else:
            ref = (sds[0][k] + sds[1][k]) / 2
        torch.testing.assert_close(out[k], ref)
    assert_sd_close(fisher_merge([sds[0], sds[0]], [fishers[0], fishers[1]]), sds[0])


def test_regmean_single_linear_is_least_squares():
    gen = torch.Generator().manual_seed(1)
    lins = [nn.Linear(6, 3).double() for _ in range(3)]
    xs = [torch.randn(n, 6, generator=gen, dtype=torch.float64) for n in (10, 7, 12)]
    # Wrapped so the Linear has a module name ("0") and keys "0.weight", "0.bias".
    seqs = [nn.Sequential(lin) for lin in lins]
    grams = [linear_input_grams(s, x, batch_size=4) for s, x in zip(seqs, xs)]
    out = regmean_merge([s.state_dict() for s in seqs], grams, alpha=1.0, merge_bias=True)
    with torch.no_grad():
        targets = torch.cat([lin(x) for lin, x in zip(lins, xs)])  # (N, out)
    xa = torch.cat([torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64)], 1) for x in xs])  # (N, in+1)
    sol = torch.linalg.lstsq(xa, targets).solution.T  # (out, in+1)
    torch.testing.assert_close(out["0.weight"], sol[:, :6])
    torch.testing.assert_close(out["0.bias"], sol[:, 6])
    # bias averaged, weight from the weight-only Gram block
    out_nb = regmean_merge([s.state_dict() for s in seqs], grams, alpha=1.0, merge_bias=False)
    torch.testing.assert_close(out_nb["0.bias"], sum(lin.bias for lin in lins).detach() / 3)
    x_only = torch.cat(xs)
    y_nobias = torch.cat([x @ lin.weight.detach().T for lin, x in zip(lins, xs)])
    torch.testing.assert_close(out_nb["0.weight"], torch.linalg.lstsq(x_only, y_nobias).solution.T)


def test_linear_input_grams_explicit():
    gen = torch.Generator().manual_seed(2)
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)).double()
    x = torch.randn(9, 3, 4, generator=gen, dtype=torch.float64)  # tokens: rows are flattened
    grams = linear_input_grams(net, x, batch_size=4)
    aug = lambda t: torch.cat([t, torch.ones(len(t), 1, dtype=t.dtype)], 1)  # noqa: E731
    x0 = x.reshape(-1, 4)
    h = torch.relu(net[0](x0)).detach()
    torch.testing.assert_close(grams["0"], aug(x0).T @ aug(x0))
    torch.testing.assert_close(grams["2"], aug(h).T @ aug(h))


@pytest.mark.parametrize("method,opts", [("soup", {}), ("fisher", {}), ("fisher", {"use_labels": False}),
                                         ("regmean", {}), ("regmean", {"alpha": 0.5, "merge_bias": True})])
def test_merge_with_itself(method, opts):
    model = make_vit(6)
    sd = model.state_dict()
    data = [(images(6, 1), torch.arange(6) % 5), (images(6, 2), torch.arange(6) % 5)]
    out = fuse(method, [sd, sd], model=model, data=data, batch_size=4, **opts)
    assert_sd_close(out, sd, 1e-7)


def test_matching_then_fusion_recovers_symmetric_copy():
    """A model and a function-equal permuted/rotated copy: matched fusion returns the model,
    unmatched soup does not."""
    a, b = make_vit(7), make_vit(7)
    sd_a = a.state_dict()
    gen = torch.Generator().manual_seed(3)
    sd_b = dict(sd_a)
    for i in range(2):
        p = torch.randperm(128, generator=gen)
        for k, sl in ((f"blocks.{i}.mlp.fc1.weight", (p,)), (f"blocks.{i}.mlp.fc1.bias", (p,)),
                      (f"blocks.{i}.mlp.fc2.weight", (slice(None), p))):
            sd_b[k] = sd_a[k][sl]
        q, _ = torch.linalg.qr(torch.randn(8, 8, generator=gen, dtype=torch.float64))
        rot = torch.block_diag(*[q] * 4)  # same rotation for every head, Q and K rows
        w = sd_a[f"blocks.{i}.attn.qkv.weight"].clone()
        w[:64] = torch.block_diag(rot, rot) @ w[:64]
        sd_b[f"blocks.{i}.attn.qkv.weight"] = w
        bias = sd_a[f"blocks.{i}.attn.qkv.bias"].clone()
        bias[:64] = torch.block_diag(rot, rot) @ bias[:64]
        sd_b[f"blocks.{i}.attn.qkv.bias"] = bias
    b.load_state_dict(sd_b)
    x = images(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(b(x), a(x))
    matched = match_to_anchor(sd_a, sd_b, num_heads=4, plain_attention=True)
    data = [(images(6, 5), None), (images(6, 6), None)]
    for method in ("soup", "fisher", "regmean"):
        assert_sd_close(fuse(method, [sd_a, matched], model=a, data=data, batch_size=3), sd_a, 1e-6)
    plain = fuse("soup", [sd_a, sd_b])
    assert (plain["blocks.0.mlp.fc1.weight"] - sd_a["blocks.0.mlp.fc1.weight"]).abs().max() > 1e-2


def test_registry_errors():
    sd = make_vit(8).state_dict()
    with pytest.raises(ValueError, match="unknown method 'avg'"):
        fuse("avg", [sd])
    with pytest.raises(ValueError, match="'regmean': needs `model`"):
        fuse("regmean", [sd, sd])
    with pytest.raises(ValueError, match="'blocks.0.mlp.fc2' is singular"):  # 2·3·17 token rows < 128 inputs
        fuse("regmean", [sd, sd], model=make_vit(8), data=[(images(3, 0), None)] * 2, alpha=1.0)
    with pytest.raises(ValueError, match="'blocks.0.attn.qkv' is singular"):  # post-LayerNorm + bias column
        fuse("regmean", [sd, sd], model=make_vit(8), data=[(images(3, 0), None)] * 2, alpha=1.0, merge_bias=True)
    # enough rows for every Linear (≥ 32 pooled rows for the head): exact regression is fine
    fuse("regmean", [sd, sd], model=make_vit(8), data=[(images(40, 0), None)] * 2, alpha=1.0)
    with pytest.raises(ValueError, match="already registered"):
        register("soup")(lambda sds, **kw: sds[0])
    with pytest.raises(ValueError, match="differs in keys"):
        fuse("soup", [sd, {k: v for k, v in sd.items() if k != "head.bias"}])


def test_weighted_average_sum_mode_and_float64_accumulation():
    # normalize=False is TAFT's plain weighted sum (any real weights); float32 entries are
    # accumulated in float64, so the result is the correctly rounded sum.
    a = {"w": torch.tensor([1.0, 1e8], dtype=torch.float32), "n": torch.tensor(3)}
    b = {"w": torch.tensor([2.0, 1.0], dtype=torch.float32), "n": torch.tensor(3)}
    out = weighted_average([a, b, a], [1.0, -0.5, -1.0], normalize=False)
    expect = (1.0 * a["w"].double() - 0.5 * b["w"].double() - 1.0 * a["w"].double()).float()
    assert out["w"].dtype == torch.float32 and torch.equal(out["w"], expect) and int(out["n"]) == 3
    with pytest.raises(ValueError, match="non-negative"):
        weighted_average([a, b], [1.0, -0.5])
