"""Rotation matching of LAST-style low-rank attention heads against a reference LSA forward."""
from __future__ import annotations

import pytest
import torch

from pipeline_src.matching import LSAKeyNames, match_lsa_projections, match_lsa_state_dict, parameter_distance

D, R = 24, 16  # model width, low rank r = H·d


def lsa_forward(p: dict, prefix: str, num_heads: int, x: torch.Tensor) -> torch.Tensor:
    """Reference LSA (minus the LayerNorm, which acts before the projections): x (B, N, D) → (B, N, D)."""
    def lin(name: str, t: torch.Tensor) -> torch.Tensor:
        out = t @ p[f"{prefix}{name}.weight"].T
        return out + p[f"{prefix}{name}.bias"] if f"{prefix}{name}.bias" in p else out

    bsz, n, _ = x.shape
    q, k, v = (lin(nm, x).reshape(bsz, n, num_heads, -1).transpose(1, 2) for nm in ("a_q", "a_k", "a_v"))  # (B, H, N, d)
    att = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    y = (att @ v).transpose(1, 2).reshape(bsz, n, -1)  # (B, N, r)
    return lin("b", y)


def random_lsa(seed: int, prefixes: list[str], bias: bool) -> dict:
    gen = torch.Generator().manual_seed(seed)
    sd = {}
    for p in prefixes:
        for name, shape in (("a_q", (R, D)), ("a_k", (R, D)), ("a_v", (R, D)), ("b", (D, R))):
            sd[f"{p}{name}.weight"] = torch.randn(*shape, generator=gen, dtype=torch.float64) * 0.4
            if bias:
                sd[f"{p}{name}.bias"] = torch.randn(shape[0], generator=gen, dtype=torch.float64) * 0.4
        sd[f"{p}norm.weight"] = torch.randn(D, generator=gen, dtype=torch.float64)
    return sd


def orth(n: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


PREFIXES = ["blocks.0.0.", "blocks.1.0."]


@pytest.mark.parametrize("num_heads", [4, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_function_preserved_and_closer(num_heads, bias):
    sd_a, sd_b = random_lsa(0, PREFIXES, bias), random_lsa(1, PREFIXES, bias)
    out = match_lsa_state_dict(sd_a, sd_b, num_heads=num_heads)  # prefixes discovered
    x = torch.randn(3, 5, D, dtype=torch.float64)
    for p in PREFIXES:
        ref = lsa_forward(sd_b, p, num_heads, x)
        rel = (lsa_forward(out, p, num_heads, x) - ref).norm() / ref.norm()
        assert rel < 1e-10
    assert out[f"{PREFIXES[0]}norm.weight"] is sd_b[f"{PREFIXES[0]}norm.weight"]
    assert parameter_distance(sd_a, out) < parameter_distance(sd_a, sd_b)
    perm = match_lsa_state_dict(sd_a, sd_b, num_heads=num_heads, rotation=False, scaling=False)
    rot = match_lsa_state_dict(sd_a, sd_b, num_heads=num_heads, rotation=True, scaling=False)
    assert parameter_distance(sd_a, rot) < parameter_distance(sd_a, perm)


@pytest.mark.parametrize("num_heads", [4, 2])
def test_recovers_known_rotations(num_heads):
    gen = torch.Generator().manual_seed(5)
    d = R // num_heads
    a = {f: torch.randn(R, D, generator=gen, dtype=torch.float64) for f in ("q", "k", "v")}
    a["o"] = torch.randn(D, R, generator=gen, dtype=torch.float64)
    a.update({f"b{f}": torch.randn(R, generator=gen, dtype=torch.float64) for f in ("q", "k", "v")})
    b = {k: v.clone() for k, v in a.items()}
    for h in range(num_heads):
        rows = slice(h * d, (h + 1) * d)
        r1, r2 = orth(d, gen), orth(d, gen)
        s, c = 0.5 + h, 2.0 / (h + 1)
        for f, rot, fac in (("q", r1, s), ("k", r1, 1 / s), ("v", r2, c)):
            b[f][rows] = fac * rot @ a[f][rows]
            b[f"b{f}"][rows] = fac * rot @ a[f"b{f}"][rows]
        b["o"][:, rows] = a["o"][:, rows] @ r2.T / c
    out = match_lsa_projections(a, b, num_heads)
    for f in a:
        torch.testing.assert_close(out[f], a[f], rtol=1e-9, atol=1e-9)


def test_custom_names_and_errors():
    names = LSAKeyNames(q="wq", k="wk", v="wv", o="up")
    sd = {k.replace("a_q", "wq").replace("a_k", "wk").replace("a_v", "wv").replace(".b.", ".up."): v
          for k, v in random_lsa(2, ["m."], True).items()}
    sd2 = {k: v + 0.1 for k, v in sd.items()}
    out = match_lsa_state_dict(sd, sd2, num_heads=2, names=names, module_prefixes=["m."])
    assert set(out) == set(sd2)
    with pytest.raises(ValueError, match="no '<prefix>a_q.weight'"):
        match_lsa_state_dict(sd, sd2, num_heads=2)
    with pytest.raises(KeyError, match="lacks 'x.wq.weight'"):
        match_lsa_state_dict(sd, sd2, num_heads=2, names=names, module_prefixes=["x."])
    with pytest.raises(ValueError, match="not divisible"):
        match_lsa_state_dict(sd, sd2, num_heads=3, names=names)


def test_real_lsa_module_preserved():
    """Against the project's LowRankSelfAttention (default key names, biases on and off)."""
    from pipeline_src.last.side_network import LowRankSelfAttention

    for qkv_bias in (True, False):
        mods = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            m = torch.nn.Sequential(*(LowRankSelfAttention(D, R, 4, qkv_bias=qkv_bias) for _ in range(2))).double()
            with torch.no_grad():
                for p in m.parameters():
                    p.copy_(torch.randn_like(p) * 0.4)
            mods.append(m)
        sd_a, sd_b = mods[0].state_dict(), mods[1].state_dict()
        out = match_lsa_state_dict(sd_a, sd_b, num_heads=4)
        assert parameter_distance(sd_a, out) < parameter_distance(sd_a, sd_b)
        x = torch.randn(2, 5, D, dtype=torch.float64)
        with torch.no_grad():
            ref = mods[1](x)
            mods[1].load_state_dict(out)
            assert ((mods[1](x) - ref).norm() / ref.norm()) < 1e-10
