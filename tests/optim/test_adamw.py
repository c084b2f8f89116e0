"""The fused AdamW against torch's single-tensor AdamW (the reference), in float64."""
import pytest
import torch

from pipeline_src.optim.adamw import adamw, fused_supported


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_fused_adamw_follows_the_single_tensor_path(weight_decay: float) -> None:
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    init = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    opt = adamw(ours, lr=3e-2, weight_decay=weight_decay)
    ref_opt = torch.optim.AdamW(ref, lr=3e-2, weight_decay=weight_decay, foreach=False)
    assert opt.defaults["fused"] is True
    for step in range(25):
        grads = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
        if step == 10:  # a schedule changes the group's lr between steps
            for o in (opt, ref_opt):
                o.param_groups[0]["lr"] = 1e-2
    for p, q, p0 in zip(ours, ref, init):
        assert not torch.allclose(p, p0)  # the steps moved every parameter
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


def test_unfused_devices_fall_back_to_torch_default() -> None:
    on_meta = [torch.nn.Parameter(torch.empty(3, device="meta"))]
    assert fused_supported([torch.nn.Parameter(torch.zeros(2))])
    assert not fused_supported(on_meta)
    assert not fused_supported([])
    assert adamw(on_meta, lr=1e-3, weight_decay=0.0).defaults["fused"] is None
