"""The jobs' own counters: FLOPs of a hand-checkable model, images per phase, the file beside the log."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline_src.runner.execute import execute
from pipeline_src.runner.step_args import Paths, StepArgs
from pipeline_src.store import job_counters
from pipeline_src.store.gemm_peak import measure_gemm_peak

# compares results of different paths (batches, caches, threads): bit-equality only where the
# same kernels see the same operands, checked on any CPU (tests/rounding_guard.py)
pytestmark = pytest.mark.rounding_guard


@pytest.fixture(autouse=True)
def fresh_counters():
    job_counters.reset()
    yield
    job_counters.reset()


def test_linear_forward_is_2_in_out_per_row():
    lin = nn.Linear(7, 5, bias=False)
    x = torch.randn(3, 7)
    out, flops = job_counters.count_flops(lin, x)
    assert flops == 2 * 7 * 5 * 3
    assert torch.equal(out, lin(x))


def test_linear_train_step_counts_forward_and_both_backward_products():
    lin = nn.Linear(7, 5)
    x = torch.randn(4, 7)
    x.requires_grad_(True)
    # forward x·Wᵀ, backward dX = dY·W and dW = dYᵀ·X: three products of 2·4·7·5
    _, flops = job_counters.count_flops(lambda: lin(x).sum().backward())
    assert flops == 3 * 2 * 4 * 7 * 5


def test_cpu_attention_is_counted_with_torchs_sdpa_formula():
    q = torch.randn(2, 3, 11, 4)
    _, flops = job_counters.count_flops(F.scaled_dot_product_attention, q, q, q)
    assert flops == 2 * (2 * 2 * 3 * 11 * 11 * 4)  # Q·Kᵀ and P·V per batch and head


def test_counting_measures_the_first_batch_and_counts_every_image():
    lin = nn.Linear(6, 2, bias=False)
    for n in (8, 8, 3):
        with job_counters.counting("eval", n, "cpu"):
            out = lin(torch.randn(n, 6))
        assert out.shape == (n, 2)
    with job_counters.counting("train", 4):
        lin(torch.randn(4, 6)).sum().backward()
    ev, tr = job_counters.PHASES["eval"], job_counters.PHASES["train"]
    assert (ev.images, ev.flops_per_image) == (19, 2 * 6 * 2)
    assert (tr.images, tr.flops_per_image) == (4, 2 * 2 * 6 * 2)  # forward and dW (the input needs no grad)


def test_counting_changes_no_result():
    torch.manual_seed(0)
    lin = nn.Linear(5, 3)
    x = torch.randn(4, 5)
    plain = lin(x)
    with job_counters.counting("eval", 4):
        counted = lin(x)
    assert torch.equal(plain, counted)


def test_execute_writes_the_counters_beside_the_log(tmp_path, monkeypatch):
    import sys
    import types

    mod = types.ModuleType("pipeline_src.steps._counted_probe")

    def main(args):
        lin = nn.Linear(3, 2, bias=False)
        for _ in range(2):
            with job_counters.counting("eval", 5, "cpu"):
                lin(torch.randn(5, 3))

    mod.main = main
    monkeypatch.setitem(sys.modules, "pipeline_src.steps._counted_probe", mod)
    log = tmp_path / "logs" / "evaluate" / "m" / "ensemble.log"
    console = __import__("os").dup(1), __import__("os").dup(2)
    try:
        assert execute("_counted_probe", StepArgs(log=Paths([str(log)]), rule="evaluate_ensemble")) == 0
    finally:
        __import__("os").dup2(console[0], 1), __import__("os").dup2(console[1], 2)
    row = pq.read_table(log.with_name("ensemble.counters.parquet")).to_pylist()[0]
    assert (row["rule"], row["images"], row["flop_images"], row["flops"]) == ("evaluate_ensemble", 10, 10, 10 * 2 * 3 * 2)
    assert row["device"] == "cpu" and row["threads"] >= 1 and row["step_wall_s"] > 0
    assert json.loads(row["phases"]) == {"eval": {"images": 10, "flops_per_image": 12.0, "math": "float32"}}
    assert row["math"] == "float32"


def test_gemm_probe_is_short_and_plausible():
    p = measure_gemm_peak("cpu", threads=1, budget_s=0.2)
    assert p.seconds < 2.0
    assert 1e8 < p.flops_per_s < 1e13  # between 0.1 GFLOP/s and 10 TFLOP/s on one CPU thread
    assert p.threads == 1 and p.device_name


def test_progress_lines_give_the_images_only_where_no_loop_counts(tmp_path):
    from pipeline_src.data.throughput import Throughput

    meter = Throughput("features")
    meter.add(7)
    meter.line()
    path = job_counters.write_counters(tmp_path / "features.log", "features", 1.0)
    row = pq.read_table(path).to_pylist()[0]
    assert (row["images"], row["flops"], row["flop_images"]) == (7, None, 0)
    with job_counters.counting("train", 3):
        nn.Linear(2, 2)(torch.randn(3, 2))
    row = pq.read_table(job_counters.write_counters(tmp_path / "train.log", "train", 1.0)).to_pylist()[0]
    assert (row["images"], row["flop_images"]) == (3, 3)  # the loop's count, not the progress line's


def test_counted_wraps_a_batch_function():
    lin = nn.Linear(4, 3, bias=False)
    fn = job_counters.counted("eval", lin, "cpu")
    x = torch.randn(6, 4)
    assert torch.equal(fn(x), lin(x)) and torch.equal(fn(x[:2]), lin(x[:2]))
    assert (job_counters.PHASES["eval"].images, job_counters.PHASES["eval"].flops_per_image) == (8, 2 * 4 * 3)


@pytest.mark.parametrize("full_batch", [False, True])
def test_dp_training_counts_its_images_and_flops(full_batch):
    """DP jobs count like the other model loops: every example of every step, and the FLOPs of the
    first batch (a Linear's forward and weight-gradient products, plus the per-example norms)."""
    from pipeline_src.dp import train_private
    from pipeline_src.dp.full_batch import train_private_full_batch

    job_counters.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    args = dict(epochs=2, lr=0.1, epsilon=8.0, delta=1e-3, max_grad_norm=1.0, public_size=40)
    steps = []
    if full_batch:
        train_private_full_batch(model, x, y, loss_fn=lambda o, t: F.cross_entropy(o, t, reduction="none"),
                                 micro_batch_size=16, progress=steps.append, **args)
    else:
        train_private(model, x, y, batch_size=10, progress=steps.append, **args)
    phase = job_counters.PHASES["train"]
    assert phase.images == sum(s["batch"] for s in steps) > 0
    assert phase.flops_per_image > 2 * 2 * 6 * 3  # forward and dW (the input needs no grad), and the norms
    job_counters.reset()
