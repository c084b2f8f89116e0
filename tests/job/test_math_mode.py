"""The math mode a job computes in and the GEMM probe of that mode (issue 41, item 1): the
efficiency table sets a bfloat16 job against the bfloat16 peak, not float32's. The mode logic and
the counted mode are checked on the CPU (CPU autocast gives bfloat16 products as CUDA's does); the
probe's ordering of peaks is checked where a GPU is."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline_src.job import counters
from pipeline_src.job.math_mode import float32_matmul_tf32, math_mode, probe_dtype, tf32_enabled
from pipeline_src.store.gemm_peak import measure_gemm_peak


@pytest.mark.parametrize("device, dtype, tf32, mode", [
    ("cuda", "bfloat16", False, "bfloat16"), ("cuda", "float16", True, "float16"),
    ("cuda", "float32", True, "tf32"), ("cuda", "float32", False, "float32"),
    ("cpu", "float32", True, "float32"),  # TF32 is a CUDA mode: the CPU computes the dtype itself
    ("cpu", "bfloat16", False, "bfloat16"), ("cpu", "float64", False, "float64"),
])
def test_math_mode_of_a_product(device, dtype, tf32, mode):
    assert math_mode(device, dtype, tf32) == mode


def test_probe_settings_and_bad_modes():
    assert probe_dtype("tf32") == ("float32", True) and probe_dtype("float32") == ("float32", False)
    assert probe_dtype("bfloat16") == ("bfloat16", False)
    with pytest.raises(ValueError, match="unknown math mode 'int8'"):
        probe_dtype("int8")
    with pytest.raises(ValueError, match="no matmul math mode for dtype 'int64'"):
        math_mode("cpu", "int64", False)
    with pytest.raises(ValueError, match="'tf32' is a CUDA mode"):
        measure_gemm_peak("cpu", threads=1, math="tf32")


def test_tf32_permission_follows_torch_and_is_restored():
    before = tf32_enabled()
    with float32_matmul_tf32(True):
        assert tf32_enabled()
        with float32_matmul_tf32(False):
            assert not tf32_enabled()
        assert tf32_enabled()
    assert tf32_enabled() == before
    old = torch.get_float32_matmul_precision() if not hasattr(torch.backends.cuda.matmul, "fp32_precision") else None
    if old is not None:  # torch < 2.9: the global setting is what a job sets
        torch.set_float32_matmul_precision("high")
        try:
            assert tf32_enabled()
        finally:
            torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("autocast, dtype, mode", [(False, torch.float32, "float32"), (True, torch.float32, "bfloat16"),
                                                    (False, torch.float64, "float64")])
def test_a_counted_batch_records_the_mode_its_products_ran_in(autocast, dtype, mode):
    counters.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(dtype)
    x = torch.randn(5, 8, dtype=dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), counters.counting("train", 5, "cpu"):
        model(x).sum().backward()
    phase = counters.PHASES["train"]
    # forward 2·(8·16 + 16·4), backward twice that less the first layer's input gradient (x needs none)
    assert phase.math == mode and phase.flops_per_image == pytest.approx(3 * 2 * (8 * 16 + 16 * 4) - 2 * 8 * 16)
    counters.reset()


def test_the_probe_times_the_mode_it_names():
    for mode in ("float32", "bfloat16", "float64"):
        p = measure_gemm_peak("cpu", threads=1, budget_s=0.2, math=mode)
        assert p.math == mode and p.seconds < 2.0 and 1e6 < p.flops_per_s < 1e13, p  # bf16 without fast kernels: small


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_peaks_order_by_mode():
    ieee, tf32, bf16 = (measure_gemm_peak("cuda", budget_s=0.3, math=m) for m in ("float32", "tf32", "bfloat16"))
    # tensor cores: bf16 above TF32 above IEEE float32 on every GPU since Ampere (H100: ~990 / 495 / 67 TFLOP/s dense)
    assert bf16.flops_per_s > 2 * ieee.flops_per_s and tf32.flops_per_s > ieee.flops_per_s, (ieee, tf32, bf16)
    counters.reset()
    model = nn.Linear(256, 256).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16), counters.counting("train", 64, "cuda"):
        model(torch.randn(64, 256, device="cuda")).sum().backward()
    assert counters.PHASES["train"].math == "bfloat16"
    counters.reset()
