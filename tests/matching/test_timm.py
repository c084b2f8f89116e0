"""Rotation/permutation/scaling matching of timm ViT state dicts (float64, tiny models)."""
from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.matching import match_many, match_to_anchor, matched_keys, parameter_distance

EMBED, DEPTH = 32, 2


def make_vit(seed: int, num_heads: int, qkv_bias: bool, **kw) -> VisionTransformer:
    """Tiny float64 ViT with every parameter random (timm's init leaves biases at zero)."""
    torch.manual_seed(seed)
    m = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=EMBED, depth=DEPTH,
                          num_heads=num_heads, qkv_bias=qkv_bias, **kw).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return m


def forward(sd: dict, num_heads: int, qkv_bias: bool, x: torch.Tensor) -> torch.Tensor:
    m = make_vit(0, num_heads, qkv_bias)
    m.load_state_dict(sd)
    with torch.no_grad():
        return m(x)


def random_orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def transform_known(sd: dict, num_heads: int, seed: int, head_perm: bool = False) -> dict:
    """B from A: per head Q,K rows ← s·R·q, R·k/s; V rows ← c·R'·v, O cols ← o·R'ᵀ/c;
    FFN hidden units permuted; optionally whole heads permuted. Written independently
    of the library with explicit loops over heads."""
    gen = torch.Generator().manual_seed(seed)
    out = {k: v.clone() for k, v in sd.items()}
    d = EMBED // num_heads
    for i in range(DEPTH):
        b = f"blocks.{i}."
        w, o = out[b + "attn.qkv.weight"], out[b + "attn.proj.weight"]
        bias = out.get(b + "attn.qkv.bias")
        new_w, new_o = w.clone(), o.clone()
        new_b = None if bias is None else bias.clone()
        order = torch.randperm(num_heads, generator=gen) if head_perm else torch.arange(num_heads)
        for h in range(num_heads):
            src = int(order[h])
            r1, r2 = random_orthogonal(d, gen), random_orthogonal(d, gen)
            s, c = float(torch.rand(1, generator=gen)) * 1.5 + 0.5, float(torch.rand(1, generator=gen)) * 1.5 + 0.5
            for part, rot, fac in ((0, r1, s), (1, r1, 1 / s), (2, r2, c)):
                rows_dst = slice(part * EMBED + h * d, part * EMBED + (h + 1) * d)
                rows_src = slice(part * EMBED + src * d, part * EMBED + (src + 1) * d)
                new_w[rows_dst] = fac * rot @ w[rows_src]
                if bias is not None:
                    new_b[rows_dst] = fac * rot @ bias[rows_src]
            new_o[:, h * d:(h + 1) * d] = o[:, src * d:(src + 1) * d] @ r2.T / c
        out[b + "attn.qkv.weight"], out[b + "attn.proj.weight"] = new_w, new_o
        if bias is not None:
            out[b + "attn.qkv.bias"] = new_b
        perm = torch.randperm(out[b + "mlp.fc1.weight"].shape[0], generator=gen)
        out[b + "mlp.fc1.weight"] = out[b + "mlp.fc1.weight"][perm]
        out[b + "mlp.fc1.bias"] = out[b + "mlp.fc1.bias"][perm]
        out[b + "mlp.fc2.weight"] = out[b + "mlp.fc2.weight"][:, perm]
    return out


def assert_close_rel(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    rel = float((a - b).norm() / b.norm())
    assert rel <= tol, rel


CONFIGS = [(4, True), (4, False), (2, True), (2, False)]


@pytest.mark.parametrize("num_heads,qkv_bias", CONFIGS)
@pytest.mark.parametrize("rotation,scaling,head_permutation", [(True, True, False), (False, False, True),
                                                               (True, False, True), (False, True, False)])
def test_function_preserved(num_heads, qkv_bias, rotation, scaling, head_permutation):
    a, b = make_vit(1, num_heads, qkv_bias), make_vit(2, num_heads, qkv_bias)
    x = torch.randn(3, 1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    matched = match_to_anchor(a.state_dict(), b.state_dict(), num_heads=num_heads, rotation=rotation,
                              scaling=scaling, head_permutation=head_permutation, plain_attention=True)
    assert parameter_distance(matched, b.state_dict()) > 1e-3  # something changed
    with torch.no_grad():
        ref = b(x)
    assert_close_rel(forward(matched, num_heads, qkv_bias, x), ref)


@pytest.mark.parametrize("num_heads,qkv_bias", CONFIGS)
@pytest.mark.parametrize("head_perm", [False, True])
def test_recovers_known_transform(num_heads, qkv_bias, head_perm):
    a = make_vit(3, num_heads, qkv_bias)
    sd_a = a.state_dict()
    sd_b = transform_known(sd_a, num_heads, seed=7, head_perm=head_perm)
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    # the construction itself is a symmetry (sanity check of the test)
    assert_close_rel(forward(sd_b, num_heads, qkv_bias, x), forward(sd_a, num_heads, qkv_bias, x), 1e-10)
    assert parameter_distance(sd_a, sd_b) > 1.0
    matched = match_to_anchor(sd_a, sd_b, num_heads=num_heads, head_permutation=head_perm, plain_attention=True)
    for k in sd_a:
        assert_close_rel(matched[k], sd_a[k])


@pytest.mark.parametrize("num_heads,qkv_bias", CONFIGS)
def test_rotation_not_farther_than_permutation(num_heads, qkv_bias):
    for seed in range(3):
        sd_a = make_vit(10 + seed, num_heads, qkv_bias).state_dict()
        sd_b = make_vit(20 + seed, num_heads, qkv_bias).state_dict()
        keys = matched_keys(sd_a)
        for hp in (False, True):
            opts = dict(num_heads=num_heads, head_permutation=hp, plain_attention=True)
            d_none = parameter_distance(sd_a, sd_b, keys)
            d_perm = parameter_distance(sd_a, match_to_anchor(sd_a, sd_b, rotation=False, scaling=False, **opts), keys)
            d_rot = parameter_distance(sd_a, match_to_anchor(sd_a, sd_b, rotation=True, scaling=False, **opts), keys)
            d_rs = parameter_distance(sd_a, match_to_anchor(sd_a, sd_b, rotation=True, scaling=True, **opts), keys)
            assert d_rs <= d_rot + 1e-9 <= d_perm + 2e-9 <= d_none + 3e-9
            assert d_rot < d_perm - 1e-6  # strictly better on random models


def test_block_subset_and_parts():
    a, b = make_vit(4, 4, True), make_vit(5, 4, True)
    sd_a, sd_b = a.state_dict(), b.state_dict()
    out = match_to_anchor(sd_a, sd_b, num_heads=4, blocks=[1], ffn=False, plain_attention=True)
    for k in sd_b:
        touched = k in {"blocks.1.attn.qkv.weight", "blocks.1.attn.qkv.bias", "blocks.1.attn.proj.weight"}
        assert (out[k] is sd_b[k]) != touched, k
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        assert_close_rel(forward(out, 4, True, x), b(x))
    serial, threaded = (match_to_anchor(sd_a, sd_b, num_heads=4, workers=w, plain_attention=True) for w in (1, 2))
    for k in serial:
        assert torch.equal(serial[k], threaded[k]), k
    out = match_to_anchor(sd_a, sd_b, num_heads=4, attention=False, plain_attention=True)
    assert out["blocks.0.attn.qkv.weight"] is sd_b["blocks.0.attn.qkv.weight"]
    assert out["blocks.0.mlp.fc1.weight"] is not sd_b["blocks.0.mlp.fc1.weight"]


def test_match_many_anchor_unchanged():
    sds = [make_vit(s, 4, True).state_dict() for s in (30, 31, 32)]
    out = match_many(sds[0], sds, num_heads=4, head_permutation=True, plain_attention=True)
    assert len(out) == 3
    for k in sds[0]:
        torch.testing.assert_close(out[0][k], sds[0][k], rtol=1e-9, atol=1e-9)


def test_unsupported_raise():
    a = make_vit(6, 4, True, qk_norm=True)
    with pytest.raises(ValueError, match="q_norm"):
        match_to_anchor(a.state_dict(), a.state_dict(), num_heads=4, plain_attention=True)
    sd = make_vit(6, 4, True).state_dict()
    with pytest.raises(ValueError, match=r"blocks \[5\]"):
        match_to_anchor(sd, sd, num_heads=4, blocks=[5], plain_attention=True)
    with pytest.raises(ValueError, match="num_heads"):
        match_to_anchor(sd, sd, num_heads=3, plain_attention=True)
    with pytest.raises(ValueError, match="no 'vit.blocks"):
        match_to_anchor(sd, sd, num_heads=4, prefix="vit.", plain_attention=True)
    sd_nb = make_vit(6, 4, False).state_dict()
    with pytest.raises(ValueError, match="qkv.bias"):
        match_to_anchor(sd, sd_nb, num_heads=4, plain_attention=True)


def test_wide_ffn_sparse_path_recovers_and_threads_agree(monkeypatch):
    """hidden 512 with DENSE_BELOW lowered: the FFN goes through the certified sparse assignment."""
    from functools import partial

    from pipeline_src.matching import match_models, sparse_assignment
    from pipeline_src.matching.ffn_permutation import ffn_permutation

    monkeypatch.setattr(sparse_assignment, "DENSE_BELOW", 256)

    a = make_vit(40, 4, True, mlp_ratio=16.0)
    sd_a = a.state_dict()
    assert sd_a["blocks.0.mlp.fc1.weight"].shape[0] == 512
    sd_b = transform_known(sd_a, 4, seed=8)
    matched = match_to_anchor(sd_a, sd_b, num_heads=4, plain_attention=True)
    for k in sd_a:
        assert_close_rel(matched[k], sd_a[k])
    sd_c = make_vit(41, 4, True, mlp_ratio=16.0).state_dict()
    serial, threaded = (match_to_anchor(sd_a, sd_c, num_heads=4, workers=w, plain_attention=True) for w in (1, 3))
    for k in serial:
        assert torch.equal(serial[k], threaded[k]), k
    monkeypatch.setattr(match_models, "ffn_permutation", partial(ffn_permutation, candidates=None))  # scipy dense
    dense = match_to_anchor(sd_a, sd_c, num_heads=4, workers=1, plain_attention=True)
    for k in serial:
        assert torch.equal(serial[k], dense[k]), k


@pytest.mark.parametrize("rotation,scaling,head_permutation", [(True, True, False), (False, True, True)])
def test_attention_layers_batched_equals_per_layer(rotation, scaling, head_permutation):
    from pipeline_src.matching.attention_rotation import match_attention_heads, match_attention_layers
    from pipeline_src.matching.match_models import _attention

    sd_a, sd_b = make_vit(50, 4, True).state_dict(), make_vit(51, 4, True).state_dict()
    bases = [f"blocks.{i}." for i in range(DEPTH)]
    opts = dict(rotation=rotation, scaling=scaling, head_permutation=head_permutation)
    batched = match_attention_layers([_attention(sd_a, b) for b in bases], [_attention(sd_b, b) for b in bases], 4,
                                     **opts)
    for base, got in zip(bases, batched):
        ref = match_attention_heads(_attention(sd_a, base), _attention(sd_b, base), 4, **opts)
        for f in ("q", "k", "v", "o", "bq", "bk", "bv"):
            torch.testing.assert_close(getattr(got, f), getattr(ref, f), rtol=1e-12, atol=1e-12)
