"""Training memory as Table 7 counts it, against references: the bytes an MLP must save for its
backward (written out by hand), and the state a real AdamW holds after a step."""
import pytest
import torch
from torch import nn

from pipeline_src.job.counters import ACTIVATIONS, counting, reset
from pipeline_src.job.training_memory import saved_activation_bytes, training_memory

B, D_IN, D_HID, D_OUT = 5, 4, 8, 3
F64 = 8  # bytes


def mlp(frozen_first: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D_IN, D_HID), nn.ReLU(), nn.Linear(D_HID, D_OUT)).double()
    if frozen_first:
        model[0].requires_grad_(False)
    return model


def test_saved_activations_are_the_inputs_of_trainable_layers_and_the_relu_output():
    x = torch.randn(B, D_IN, dtype=torch.float64)
    with saved_activation_bytes() as total:
        mlp()(x).sum().backward()
    # Linear 1 saves x (its weight's gradient needs it); ReLU saves its output, which Linear 2 saves
    # again as its input (one storage); weights saved for the input gradient are parameters, not activations.
    assert total[0] == B * D_IN * F64 + B * D_HID * F64


def test_a_prefix_run_without_grad_saves_nothing():
    model = mlp()
    x = torch.randn(B, D_IN, dtype=torch.float64)
    with saved_activation_bytes() as total:
        with torch.no_grad():
            h = model[1](model[0](x))  # the frozen prefix: no graph
        model[2](h).sum().backward()
    assert total[0] == B * D_HID * F64  # only the side part's input


def test_weights_gradients_and_optimizer_state_match_a_real_adamw():
    reset()
    model = mlp(frozen_first=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    x = torch.randn(B, D_IN, dtype=torch.float64)
    with counting("train", B, memory=True):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    mem = training_memory(model)
    mb = 2 ** 20
    trainable = (D_HID * D_OUT + D_OUT) * F64
    assert mem["weights_mb"] * mb == (D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT) * F64
    assert mem["gradients_mb"] * mb == sum(p.grad.nbytes for p in model.parameters() if p.grad is not None) == trainable
    adam_state = sum(v.nbytes for s in opt.state.values() for k, v in s.items() if k != "step")
    assert mem["optimizer_mb"] * mb == adam_state
    assert mem["activations_mb"] * mb == B * D_HID * F64  # the frozen first layer needs no x
    assert mem["train_mem_mb"] == pytest.approx(sum(mem[k] for k in ("weights_mb", "gradients_mb", "optimizer_mb",
                                                                     "activations_mb")))
    assert mem["activations_batch"] == B


def test_only_the_first_batch_is_measured_and_values_are_unchanged():
    reset()
    measured, plain = mlp(), mlp()
    x = torch.randn(B, D_IN, dtype=torch.float64)
    with counting("train", B, memory=True):
        measured(x).sum().backward()
    plain(x).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(measured.parameters(), plain.parameters()))
    with counting("train", 2 * B, memory=True):  # a later, larger batch leaves the measurement as it was
        measured(torch.cat([x, x])).sum().backward()
    assert ACTIVATIONS == {"bytes": B * D_IN * F64 + B * D_HID * F64, "batch": B}


def test_without_memory_nothing_is_measured():
    reset()
    with counting("train", B):
        mlp()(torch.randn(B, D_IN, dtype=torch.float64)).sum().backward()
    assert ACTIVATIONS["bytes"] is None
    assert training_memory(mlp())["train_mem_mb"] is None
