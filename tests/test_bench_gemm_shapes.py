"""benchmarks/bench_gemm_shapes.py replays exactly the products the jobs' FLOP counter counts: the
replay's FLOPs equal the recorded step's (a tiny float64 ViT step, forward and backward)."""
from __future__ import annotations

import sys

import torch
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.job.counters import flop_counter
from tests.conftest import REPO


def test_replayed_products_carry_every_counted_flop():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_gemm_shapes as bench
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    torch.manual_seed(0)
    model = VisionTransformer(img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=16, depth=1,
                              num_heads=2, mlp_ratio=2.0).double()
    x, y = torch.randn(4, 1, 8, 8, dtype=torch.float64), torch.tensor([0, 1, 2, 0])

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()

    with flop_counter() as counted:
        step()
    recorder = bench.ProductRecorder()
    with recorder:
        step()
    calls = bench.replayable(recorder.calls)
    assert {str(f.overloadpacket) for f, _, _ in calls} >= {"aten.addmm", "aten.mm", "aten.convolution"}
    with flop_counter() as replayed:
        for f, args, kwargs in calls:
            f(*args, **kwargs)
    assert replayed.get_total_flops() == counted.get_total_flops() > 0
