"""The fusion study's model code on tiny float64 models: matching keeps each shard model's
function, fusing a model with itself returns it, Fisher through the prefix view equals
per-example gradients taken one at a time, and the config checks name their keys."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from pipeline_src.fusion import diagonal_fisher
from pipeline_src.matching import parameter_distance
from pipeline_src.methods.fusion_models import (
    chosen_blocks,
    logits_from,
    match_state,
    matchable_keys,
    num_heads_of,
    prefix_view,
    reinit_method_config,
    reinit_tail_blocks,
    reinit_tuned,
)
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.plan.fusion import FusionConfigError, check_fusion_config, fusion_targets
from pipeline_src.steps.fusion.fuse import fuse_states
from tests.conftest import tiny_vit

pytestmark = pytest.mark.usefixtures("float64_default")
METHODS = {"nlft": {"kind": "nlft", "k": 2}, "last": {"kind": "last", "rank": 8, "heads": 2}}
NUM_CLASSES = 3


def shard_model(method_cfg: dict, shard: int):
    """A trained-looking shard model from its own random init (the `random_reinit` setting)."""
    cfg = reinit_method_config(method_cfg, 100 + shard)
    model = build_tuned_model(tiny_vit(), cfg, NUM_CLASSES, seed=0)
    reinit_tuned(model, cfg, 100 + shard)
    g = torch.Generator().manual_seed(shard)
    with torch.no_grad():  # move every trained tensor (biases too) away from its init
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def images(n: int = 6) -> torch.Tensor:
    return torch.randn(n, 1, 16, 16, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("kind", ["nlft", "last"])
@pytest.mark.parametrize("matching", ["permutation", "rotation", "rotation-scaling"])
def test_matching_keeps_each_shard_models_logits_and_moves_it_towards_the_anchor(kind, matching):
    anchor_model, model = shard_model(METHODS[kind], 0), shard_model(METHODS[kind], 1)
    anchor, state = anchor_model.trainable_state(), model.trainable_state()
    blocks = chosen_blocks(anchor, kind, None)
    matched = match_state(anchor, state, matching=matching, kind=kind, num_heads=num_heads_of(model, METHODS[kind]),
                          blocks=blocks, ffn=True, model=model)
    x = images()
    with torch.no_grad():
        reference = model(x)  # the unmatched model, full forward from images
    template = copy.deepcopy(anchor_model)
    got = logits_from(template, matched, template.prefix(x))
    assert torch.allclose(got, reference, rtol=1e-9, atol=1e-9 * reference.abs().max())
    assert any(not torch.equal(matched[k], state[k]) for k in matched)
    keys = matchable_keys(anchor, kind, blocks, ffn=True)
    assert parameter_distance(anchor, matched, keys) < parameter_distance(anchor, state, keys)


def test_rotation_ends_no_farther_than_permutation_and_block_subsets_touch_only_their_block():
    model = shard_model(METHODS["nlft"], 1)
    anchor, state = shard_model(METHODS["nlft"], 0).trainable_state(), model.trainable_state()
    kw = dict(kind="nlft", num_heads=4, ffn=True, model=model)
    dist = {m: parameter_distance(anchor, match_state(anchor, state, matching=m, blocks=[0, 1], **kw))
            for m in ("permutation", "rotation", "rotation-scaling")}
    assert dist["rotation-scaling"] <= dist["rotation"] + 1e-12 <= dist["permutation"] + 2e-12
    last_only = match_state(anchor, state, matching="rotation", blocks=chosen_blocks(anchor, "nlft", [-1]), **kw)
    assert all(torch.equal(last_only[k], state[k]) for k in state if not k.startswith("blocks.1."))
    assert not torch.equal(last_only["blocks.1.attn.qkv.weight"], state["blocks.1.attn.qkv.weight"])
    with pytest.raises(ValueError, match="fusion.blocks"):
        chosen_blocks(anchor, "nlft", [2])


def test_pipeline_matching_checks_the_modules_and_the_head_count():
    """The pipeline's matching passes the tuned model, so the library's module checks run: a
    wrong head count and a parameter-free q/k norm are refused by name (both were accepted)."""
    model = shard_model(METHODS["nlft"], 1)
    anchor, state = shard_model(METHODS["nlft"], 0).trainable_state(), model.trainable_state()
    with pytest.raises(ValueError, match=r"'blocks.0.attn' has 4 heads, but matching was asked for num_heads=2"):
        match_state(anchor, state, matching="rotation", kind="nlft", num_heads=2, blocks=[0, 1], ffn=True, model=model)
    model.model.blocks[1].attn.q_norm = torch.nn.LayerNorm(4, elementwise_affine=False)
    with pytest.raises(ValueError, match=r"'blocks.1.attn.q_norm' \(LayerNorm\) breaks"):
        match_state(anchor, state, matching="rotation", kind="nlft", num_heads=4, blocks=[0, 1], ffn=True, model=model)
    with pytest.raises(ValueError, match="needs the tuned model"):
        match_state(anchor, state, matching="rotation", kind="nlft", num_heads=4, blocks=[0, 1], ffn=True)


@pytest.mark.parametrize("kind", ["nlft", "last"])
@pytest.mark.parametrize("fusion", ["soup", "fisher", "regmean"])
def test_fusing_a_model_with_itself_returns_it(kind, fusion):
    model = shard_model(METHODS[kind], 0)
    state = model.trainable_state()
    h = model.prefix(images(8))
    data = None if fusion == "soup" else [(h, torch.arange(8) % NUM_CLASSES)] * 3
    fused = fuse_states(fusion, [state] * 3, copy.deepcopy(model), data)
    assert set(fused) == set(state)
    for k in state:
        assert torch.allclose(fused[k], state[k], rtol=1e-9, atol=1e-12), k


def test_fused_states_differ_from_the_soup_only_through_the_statistics():
    a, b = (shard_model(METHODS["nlft"], i) for i in (0, 1))
    sa, sb = a.trainable_state(), b.trainable_state()
    h = a.prefix(images(8))
    y = torch.arange(8) % NUM_CLASSES
    soup = fuse_states("soup", [sa, sb], copy.deepcopy(a), None)
    assert all(torch.allclose(soup[k], (sa[k] + sb[k]) / 2) for k in sa)
    regmean = fuse_states("regmean", [sa, sb], copy.deepcopy(a), [(h, y), (h, y)])
    assert not torch.allclose(regmean["blocks.1.attn.qkv.weight"], soup["blocks.1.attn.qkv.weight"])
    assert torch.equal(regmean["norm.weight"], soup["norm.weight"])  # not a Linear: averaged


@pytest.mark.parametrize("kind", ["nlft", "last"])
def test_fisher_through_the_prefix_view_equals_one_example_at_a_time(kind):
    model = shard_model(METHODS[kind], 0)
    h, y = model.prefix(images(4)), torch.tensor([0, 2, 1, 2])
    view = prefix_view(model)
    fisher = diagonal_fisher(view, h, y, batch_size=3)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    ref = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(4):
        loss = F.log_softmax(model.forward_from_prefix(h[i:i + 1]), -1)[0, y[i]]
        for (n, _), g in zip(params.items(), torch.autograd.grad(loss, list(params.values()))):
            ref[n] += g ** 2 / 4
    root = "model." if kind == "nlft" else "side."
    assert {f"root.{n.removeprefix(root)}" for n in ref} == set(fisher)
    for n, r in ref.items():
        assert torch.allclose(fisher[f"root.{n.removeprefix(root)}"], r, rtol=1e-8, atol=1e-14), n


def test_reinit_changes_only_the_tuned_blocks_and_depends_on_the_seed():
    models = [build_tuned_model(tiny_vit(), METHODS["nlft"] | {"k": 1}, NUM_CLASSES, seed=0) for _ in range(3)]
    for m, s in zip(models, (1, 2, 1)):
        reinit_tail_blocks(m, s)
    sds = [m.model.state_dict() for m in models]
    base = tiny_vit().state_dict()
    assert all(torch.equal(sds[0][k], base[k]) for k in base if k.startswith("blocks.0."))
    assert all(torch.equal(sds[0][k], sds[2][k]) for k in sds[0])
    assert not torch.equal(sds[0]["blocks.1.mlp.fc1.weight"], sds[1]["blocks.1.mlp.fc1.weight"])
    assert reinit_method_config(METHODS["last"], 5)["init_seed"] == 5


def study_config(**fusion) -> dict:
    return {"methods": {"fc": {"kind": "fc"}, "nlft-1": {"kind": "nlft", "k": 1}, "taft-1": {"kind": "taft", "k": 1},
                        "last": {"kind": "last", "rank": 8, "heads": 2}},
            "shards": [1, 2], "seeds": [0], "backbone": {"source": "pretrain", "arch": {"depth": 2}},
            "fusion": {"enabled": True, "methods": [], "shards": [], "blocks": None, "match_ffn": True,
                       "inits": ["shared"], "matching": ["none", "rotation"], "fusions": ["soup"], **fusion}}


@pytest.mark.parametrize("fusion, key", [({"methods": ["taft-1"]}, "fusion.methods"),
                                         ({"methods": ["nope"]}, "fusion.methods"),
                                         ({"shards": [4]}, "fusion.shards"),
                                         ({"blocks": [1]}, "fusion.blocks")])
def test_config_errors_name_the_key(fusion, key):
    with pytest.raises(FusionConfigError, match=key.replace(".", r"\.")):
        check_fusion_config(study_config(**fusion))


def test_targets_cover_every_method_shard_count_and_matching_only_when_enabled():
    cfg = study_config()
    check_fusion_config(cfg)
    targets = fusion_targets(cfg)
    assert len(targets) == 2 * 2 * (1 + 1)  # methods nlft-1 and last; matchings none, rotation; soup
    assert "results/metrics/fuse/shared/last/n2_s0/rotation/soup.parquet" in targets
    assert fusion_targets(study_config(enabled=False)) == []


def _permute_heads(state: dict, blocks: list[int], heads: int, perm: list[int]) -> dict:
    """`state` with the attention heads of `blocks` reordered by `perm` (the same function)."""
    out = dict(state)
    for b in blocks:
        qkv, proj = state[f"blocks.{b}.attn.qkv.weight"], state[f"blocks.{b}.attn.proj.weight"]
        d = proj.shape[1] // heads
        rows = torch.cat([torch.arange(t * heads * d + h * d, t * heads * d + (h + 1) * d)
                          for t in range(3) for h in perm])
        out[f"blocks.{b}.attn.qkv.weight"] = qkv[rows]
        if f"blocks.{b}.attn.qkv.bias" in state:
            out[f"blocks.{b}.attn.qkv.bias"] = state[f"blocks.{b}.attn.qkv.bias"][rows]
        out[f"blocks.{b}.attn.proj.weight"] = proj[:, torch.cat([torch.arange(h * d, (h + 1) * d) for h in perm])]
    return out


@pytest.mark.parametrize("matching", ["rotation", "rotation-scaling"])
def test_fusion_head_permutation_recovers_models_whose_heads_are_permuted(matching):
    """`fusion.head_permutation`: without it, within-head matching leaves models whose heads are
    permuted far apart; with it they are matched back to the anchor."""
    model = shard_model(METHODS["nlft"], 0)
    anchor = model.trainable_state()
    permuted = _permute_heads(anchor, [0, 1], 4, [2, 0, 3, 1])
    x = images()
    template = copy.deepcopy(model)
    with torch.no_grad():
        torch.testing.assert_close(logits_from(template, permuted, template.prefix(x)), model(x))  # same function
    kw = dict(matching=matching, kind="nlft", num_heads=4, blocks=[0, 1], ffn=False, model=model)
    keys = matchable_keys(anchor, "nlft", [0, 1], ffn=False)
    scale = parameter_distance(anchor, {k: torch.zeros_like(v) for k, v in anchor.items()}, keys)
    within = parameter_distance(anchor, match_state(anchor, permuted, **kw), keys) / scale
    across = parameter_distance(anchor, match_state(anchor, permuted, head_permutation=True, **kw), keys) / scale
    assert within > 0.1 and across < 1e-9, (within, across)


def test_fusion_head_permutation_is_a_config_key_of_the_match_and_fuse_settings():
    from pipeline_src.plan.config import validate_config
    from pipeline_src.plan.fusion import variant
    from pipeline_src.plan.step_settings import settings_for
    from tests.e2e.conftest import tiny_config

    cfg = tiny_config()
    off = validate_config(copy.deepcopy(cfg))
    assert off["fusion"]["head_permutation"] is False
    assert "head_permutation" not in settings_for("fusion_match", off)["fusion"]  # default: nothing reruns
    cfg["fusion"]["head_permutation"] = True
    on = validate_config(cfg)
    for rule in ("fusion_match", "fuse"):
        assert settings_for(rule, on, {"fusion": "soup"})["fusion"]["head_permutation"] is True
    assert '"head_permutation": true' in variant(on, "shared", "rotation")
    assert "head_permutation" not in variant(off, "shared", "rotation")
