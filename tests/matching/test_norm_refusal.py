"""Matching refuses norms that break the rotation symmetry by checking MODULES, not keys:
a parameter-free q_norm/k_norm or attention-output norm leaves no state-dict key, and
matching such a model silently changes its function (float64, tiny timm ViTs)."""
from __future__ import annotations

import re
from functools import partial

import pytest
import torch
from timm.layers import RmsNorm, SwiGLUPacked
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pipeline_src.matching import match_to_anchor
from pipeline_src.matching.match_models import check_matchable_modules

TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=4)
FREE_LN = partial(nn.LayerNorm, elementwise_affine=False)  # a norm without parameters


def make(seed: int, **kw) -> VisionTransformer:
    torch.manual_seed(seed)
    m = VisionTransformer(**{**TINY, **kw}).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return m


def x() -> torch.Tensor:
    return torch.randn(4, 1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def rel_change_after_matching(model: VisionTransformer, anchor: VisionTransformer, check: bool = True,
                              **kw) -> float:
    """Relative logit change of `model` once its state dict is matched to `anchor` (with the
    module check when `check`)."""
    matched = match_to_anchor(anchor.state_dict(), model.state_dict(), num_heads=4,
                              model=model if check else None, plain_attention=not check, **kw)
    with torch.no_grad():
        before = model(x())
        model.load_state_dict(matched)
        return float((model(x()) - before).norm() / before.norm())


def free_qk_norm(m: VisionTransformer) -> VisionTransformer:
    for blk in m.blocks:
        blk.attn.q_norm, blk.attn.k_norm = FREE_LN(8).double(), FREE_LN(8).double()
    return m


def test_plain_model_passes_and_keeps_its_function() -> None:
    """The control: a standard ViT passes the module check and matching preserves its function."""
    anchor, model = make(0), make(1)
    check_matchable_modules(model)
    assert rel_change_after_matching(model, anchor) < 1e-10


def test_parameter_free_qk_norm_breaks_matching_without_module_check() -> None:
    """Why the keys are not enough: no key shows the norm, and the function changes."""
    anchor, model = free_qk_norm(make(0)), free_qk_norm(make(1))
    assert not any("q_norm" in k or "k_norm" in k for k in model.state_dict())
    assert rel_change_after_matching(model, anchor, check=False) > 1e-2


@pytest.mark.parametrize("edit,match", [
    (free_qk_norm, r"'blocks\.0\.attn\.q_norm' \(LayerNorm\) breaks"),
    (lambda m: setattr(m.blocks[1].attn, "k_norm", FREE_LN(8)) or m, r"'blocks\.1\.attn\.k_norm' \(LayerNorm\)"),
    (lambda m: setattr(m.blocks[0].attn, "norm", FREE_LN(32)) or m, r"'blocks\.0\.attn\.norm' \(LayerNorm\)"),
    (lambda m: setattr(m.blocks[0].attn, "q_norm", RmsNorm(8, affine=False)) or m, r"attn\.q_norm' \(RmsNorm\)"),
])
def test_parameter_free_norms_refused_by_module(edit, match: str) -> None:
    anchor, model = make(0), edit(make(1))
    assert set(model.state_dict()) == set(anchor.state_dict())  # the key check cannot see it
    with pytest.raises(ValueError, match=match):
        match_to_anchor(anchor.state_dict(), model.state_dict(), num_heads=4, model=model)
    with pytest.raises(ValueError, match=match):
        check_matchable_modules(model)


def test_only_chosen_blocks_and_parts_are_checked() -> None:
    model = make(1)
    model.blocks[0].attn.q_norm = FREE_LN(8)
    check_matchable_modules(model, blocks=[1])  # block 0 is not matched
    check_matchable_modules(model, attention=False)  # FFN-only matching does not touch attention
    anchor = make(0)
    rel = rel_change_after_matching(model, anchor, blocks=[1])
    assert rel < 1e-10


def test_prefix_and_ffn_modules() -> None:
    wrapper = nn.Module()
    wrapper.backbone = make(1, mlp_layer=SwiGLUPacked, act_layer="silu", mlp_ratio=2)
    with pytest.raises(ValueError, match=r"'backbone\.blocks\.0\.mlp' is GluMlp"):
        check_matchable_modules(wrapper, prefix="backbone.")
    check_matchable_modules(wrapper, prefix="backbone.", ffn=False)
    with pytest.raises(ValueError, match="has no 'blocks'"):
        check_matchable_modules(wrapper)
    model = make(1)
    model.blocks[1].mlp.norm = FREE_LN(128)
    with pytest.raises(ValueError, match=r"'blocks\.1\.mlp\.norm'"):
        check_matchable_modules(model)


def test_a_head_count_other_than_the_models_is_refused_by_name():
    """`num_heads=2` on a 4-head ViT was accepted and changed the logits by 0.47."""
    anchor, model = make(0), make(1)
    assert model.blocks[0].attn.num_heads == 4
    wrong = match_to_anchor(anchor.state_dict(), model.state_dict(), num_heads=2,  # keys alone cannot tell
                            plain_attention=True)
    with torch.no_grad():
        before = model(x())
        model.load_state_dict(wrong)
        changed = model(x())
    assert float((changed - before).norm() / before.norm()) > 1e-2  # what the check prevents
    model = make(1)
    with pytest.raises(ValueError, match=r"'blocks.0.attn' has 4 heads, but matching was asked for num_heads=2"):
        match_to_anchor(anchor.state_dict(), model.state_dict(), num_heads=2, model=model)
    match_to_anchor(anchor.state_dict(), model.state_dict(), num_heads=4, model=model)


def test_without_the_model_matching_is_refused_unless_the_caller_vouches_for_plain_attention():
    """A parameter-free q/k norm changed the logits by 2.3e-1 when matched from the keys alone."""
    anchor, model = free_qk_norm(make(0)), free_qk_norm(make(1))
    with pytest.raises(ValueError, match=r"match_to_anchor: pass the model \(`model=`\).*`plain_attention=True`"):
        match_to_anchor(anchor.state_dict(), model.state_dict(), num_heads=4)
    match_to_anchor(anchor.state_dict(), model.state_dict(), num_heads=4, plain_attention=True)  # vouched


@pytest.mark.parametrize("heads", [None, 4.0, "4", True, 0, -4])
def test_a_head_count_that_is_not_a_positive_int_is_refused_naming_num_heads(heads):
    anchor, model = make(0), make(1)
    with pytest.raises(TypeError, match=rf"num_heads must be a positive int, got {re.escape(repr(heads))}"):
        match_to_anchor(anchor.state_dict(), model.state_dict(), num_heads=heads, model=model)
