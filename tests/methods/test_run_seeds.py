"""A run seed varies every random choice of a run (issue 42): the head init, TAFT's PT = F reset and
reset CLS token, the LAST side network's init and the shard assignment, besides the batch order;
within one run seed every shard shares one init (soups and the TAFT Δw sum need it), and a record's
`head_seed` rebuilds the same start (a run replays)."""
from __future__ import annotations

import torch

from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.plan.job_settings import init_seed
from pipeline_src.plan.sharding import shard_manifest
from tests.conftest import tiny_vit

TAFT_PT_F = {"kind": "taft", "k": 1, "reset": True, "reset_cls": True}
LAST = {"kind": "last", "rank": 4, "heads": 2, "every": 1, "modules_per_block": 2}
NLFT_CLS = {"kind": "nlft", "k": 1, "reset_cls": True}


def _start(method: dict, run_seed: int, config_seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of a fresh tuned model (parameters and buffers: TAFT's reset point is buffers)."""
    model = build_tuned_model(tiny_vit(seed=0), method, num_classes=5, seed=init_seed(config_seed, run_seed))
    return {**{n: p.detach().clone() for n, p in model.named_parameters()},
            **{n: b.clone() for n, b in model.named_buffers() if b is not None}}


def test_the_first_run_seed_keeps_the_config_seed_and_others_differ():
    assert init_seed(0, 0) == 0 and init_seed(5, 0) == 5  # seed 0: the init of the studies before issue 42
    assert len({init_seed(c, r) for c in (0, 1, 2) for r in (0, 1, 2)}) == 9


def _differs(a: dict, b: dict, names) -> bool:
    return any(not torch.equal(a[n], b[n]) for n in names)


def test_two_run_seeds_give_different_inits_and_one_seed_the_same():
    for method, keys in ((TAFT_PT_F, ("head", "cls_token", "blocks.0")), (LAST, ("side",)),
                         ({"kind": "fc"}, ("head",)), (NLFT_CLS, ("tail_cls", "head"))):
        s0, again, s1 = _start(method, 0), _start(method, 0), _start(method, 1)
        assert set(s0) == set(s1)
        for key in keys:
            names = [n for n in s0 if key in n]
            assert names, (method["kind"], key)
            assert _differs(s0, s1, names), (method["kind"], key)  # another run seed: another start
        assert not _differs(s0, again, s0), method["kind"]  # one run seed: every shard the same start


def test_the_reset_point_follows_the_run_seed_and_replays_from_the_record():
    model = build_tuned_model(tiny_vit(seed=0), TAFT_PT_F, num_classes=5, seed=init_seed(0, 2))
    assert model.reset_seed == init_seed(0, 2)
    rebuilt = build_tuned_model(tiny_vit(seed=0), TAFT_PT_F, num_classes=5, seed=init_seed(0, 2))
    assert model.linearization_id() == rebuilt.linearization_id()  # the record's head_seed rebuilds it
    assert _start(TAFT_PT_F, 1)["cls_token"].shape == (1, 1, 32)


def test_two_run_seeds_give_different_shard_assignments():
    ids = [f"s{i:04d}" for i in range(400)]
    a, b = shard_manifest(ids, 10, 0), shard_manifest(ids, 10, 1)
    assert a.column("sample_id").to_pylist() == b.column("sample_id").to_pylist()
    moved = sum(x != y for x, y in zip(a.column("shard").to_pylist(), b.column("shard").to_pylist()))
    assert moved > 300  # a fresh random split: ~90 % of the samples change shard at N = 10
    assert shard_manifest(ids, 10, 1).equals(b)
