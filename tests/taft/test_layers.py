"""Closed-form JVP layers vs torch.func.jvp of the original timm modules (float64)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, LayerNorm, LayerScale, Mlp, RmsNorm
from timm.layers.activations import GELUTanh
from timm.models.vision_transformer import Block
from torch.func import functional_call, jvp

from pipeline_src.taft.jvp_block import TangentAttention, TangentBlock, TangentMlp
from pipeline_src.taft.jvp_layers import (
    TangentGELU,
    TangentLayerNorm,
    TangentLayerScale,
    TangentLinear,
    delta_scale_grad_sample,
    gelu_derivative,
    gelu_jvp,
)

pytestmark = pytest.mark.usefixtures("float64_default")  # float64 for reference comparisons
torch.set_num_threads(1)  # tiny tensors: extra threads only add sync cost on the shared 2-core box
D, N, B = 32, 5, 3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp(min=1e-30))


def collect_pairs(tangent_mod: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """timm-relative parameter name -> (w, Δ) for every Tangent* submodule."""
    out = {}
    for path, m in tangent_mod.named_modules():
        if hasattr(m, "pairs"):
            for local, pair in m.pairs().items():
                out[f"{path}.{local}" if path else local] = pair
    return out


def reference_jvp(base: nn.Module, tangent_mod: nn.Module, x: torch.Tensor, t: torch.Tensor):
    """torch.func.jvp of base w.r.t. (input, linearized params) with tangents (t, Δ)."""
    pairs = collect_pairs(tangent_mod)
    names = list(pairs)

    def f(inp, *vals):
        return functional_call(base, dict(zip(names, vals)), (inp,))

    primals = (x, *[w for w, _ in pairs.values()])
    tangents = (t, *[d.detach() for _, d in pairs.values()])
    return jvp(f, primals, tangents)


def check(base: nn.Module, tangent_mod: nn.Module, shape=(B, N, D)) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g)
    t = torch.randn(shape, generator=g)
    y_ref, dy_ref = reference_jvp(base, tangent_mod, x, t)
    y, dy = tangent_mod(x, t)
    assert rel_err(y, y_ref) < 1e-10
    assert rel_err(dy, dy_ref) < 1e-10
    # A None tangent means zero: it must equal passing an explicit zero tangent.
    y0_ref, dy0_ref = reference_jvp(base, tangent_mod, x, torch.zeros_like(t))
    y0, dy0 = tangent_mod(x, None)
    assert rel_err(y0, y0_ref) < 1e-10
    assert rel_err(dy0, dy0_ref) < 1e-10


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(7)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias: bool) -> None:
    base = nn.Linear(D, 2 * D, bias=bias)
    check(base, TangentLinear(base, 0.3, gen()))


@pytest.mark.parametrize("cls", [nn.LayerNorm, LayerNorm])
def test_layer_norm(cls) -> None:
    base = cls(D, eps=1e-6)
    with torch.no_grad():
        base.weight.normal_()
        base.bias.normal_()
    check(base, TangentLayerNorm(base, 0.3, gen()))


@pytest.mark.parametrize("act", [nn.GELU(), nn.GELU(approximate="tanh"), GELUTanh()])
def test_gelu(act: nn.Module) -> None:
    x = torch.linspace(-6, 6, 201)
    t = torch.randn(201, generator=gen())
    y_ref, dy_ref = jvp(act, (x,), (t,))
    y, dy = TangentGELU(act)(x, t)
    assert rel_err(y, y_ref) < 1e-12 and rel_err(dy, dy_ref) < 1e-10
    # The fused kernel equals the written-out derivative Φ(x) + x·φ(x) (or its tanh form).
    approx = TangentGELU(act).approximate
    assert rel_err(dy, gelu_derivative(x, approx) * t) < 1e-12


def test_gelu_derivative_at_zero_is_half() -> None:
    # Φ(0) + 0·φ(0) = 1/2 exactly; the gelu(x)/(x+ε) shortcut gets this wrong.
    _, d = gelu_jvp(torch.zeros(1), torch.ones(1))
    assert float(d) == 0.5 and float(gelu_derivative(torch.zeros(1))) == 0.5


def test_layer_scale_and_grad_sampler() -> None:
    base = LayerScale(D, init_values=0.3)
    tm = TangentLayerScale(base, 0.3, gen())
    check(base, tm)
    # Per-sample grads of the Δγ module vs micro-batches of size one.
    x = torch.randn(B, N, D, generator=gen())
    gs = []
    for b in range(B):
        tm.zero_grad()
        tm.delta(x[b:b + 1]).square().sum().backward()
        gs.append(tm.delta.weight.grad.clone())
    fast = delta_scale_grad_sample(tm.delta, [x], 2 * tm.delta(x).detach())[tm.delta.weight]
    assert rel_err(fast, torch.stack(gs)) < 1e-12


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_attention(qkv_bias: bool) -> None:
    base = Attention(D, num_heads=4, qkv_bias=qkv_bias).eval()
    base.fused_attn = False  # forward-mode AD cannot go through fused SDPA
    check(base, TangentAttention(base, 0.3, gen()))


def test_mlp() -> None:
    base = Mlp(D, 4 * D)
    check(base, TangentMlp(base, 0.3, gen()))


@pytest.mark.parametrize("init_values", [None, 0.5])
@pytest.mark.parametrize("qkv_bias", [True, False])
def test_block(init_values, qkv_bias: bool) -> None:
    base = Block(D, num_heads=2, qkv_bias=qkv_bias, init_values=init_values, act_layer=nn.GELU).eval()
    base.attn.fused_attn = False
    check(base, TangentBlock(base, 0.3, gen()))


def test_delta_modules_are_standard_and_bases_frozen() -> None:
    base = Block(D, num_heads=2, qkv_bias=True, init_values=0.5).eval()
    tb = TangentBlock(base, 0.0)
    kinds = {type(m).__name__ for n, m in tb.named_modules() if n.endswith("delta")}
    assert kinds == {"Linear", "LayerNorm", "DeltaScale"}
    assert all(n.split(".")[-2] == "delta" for n, _ in tb.named_parameters())
    assert len(list(tb.buffers())) > 0


@pytest.mark.parametrize("bad, match", [
    (lambda: TangentLinear(nn.Conv1d(2, 2, 1)), "Conv1d"),
    (lambda: TangentLayerNorm(nn.LayerNorm(D, elementwise_affine=False)), "affine"),
    (lambda: TangentGELU(nn.ReLU()), "ReLU"),
    (lambda: TangentAttention(Attention(D, 4, qk_norm=True, norm_layer=RmsNorm)), r"qk_norm=True with RmsNorm"),
    (lambda: TangentMlp(Mlp(D, 2 * D, norm_layer=nn.LayerNorm)), "mlp.norm"),
])
def test_unsupported_layers_raise(bad, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        bad()


def test_gelu_bad_approximate_raises() -> None:
    with pytest.raises(ValueError, match="approximate"):
        gelu_jvp(torch.zeros(1), torch.zeros(1), "sigmoid")
    with pytest.raises(ValueError, match="approximate"):
        gelu_derivative(torch.zeros(1), "sigmoid")
    assert F.gelu(torch.zeros(1)).item() == 0.0
