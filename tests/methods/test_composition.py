import pytest
import torch

from pipeline_src.fusion.soup import weighted_average
from pipeline_src.methods.composition import ensemble_logits
from pipeline_src.methods.registry import build_tuned_model
from tests.conftest import tiny_vit


def test_soup_of_copies_is_the_model_and_average_is_exact():
    model = build_tuned_model(tiny_vit(), {"kind": "nlft", "k": 1}, num_classes=3, seed=0)
    s = model.trainable_state()
    soup = weighted_average([s, s, s])
    assert all(torch.allclose(soup[k], s[k]) for k in s)
    t = {k: v + 1.0 for k, v in s.items()}
    mid = weighted_average([s, t], weights=[0.25, 0.75])
    assert all(torch.allclose(mid[k], s[k] + 0.75) for k in s)


def test_fc_soup_equals_ensemble_because_the_head_is_linear():
    # With only the head trained, averaging weights and averaging logits coincide: an
    # independent check of both code paths.
    x = torch.randn(6, 1, 16, 16, dtype=torch.float64)
    models = []
    for seed in range(3):
        m = build_tuned_model(tiny_vit(), {"kind": "fc"}, num_classes=3, seed=seed)
        models.append(m)
    soup = build_tuned_model(tiny_vit(), {"kind": "fc"}, num_classes=3, seed=0)
    soup.load_trainable_state(weighted_average([m.trainable_state() for m in models]))
    assert torch.allclose(soup(x), ensemble_logits([m(x) for m in models]))


def test_mismatched_components_are_refused():
    a = {"w": torch.zeros(2)}
    with pytest.raises(ValueError, match="differs in keys"):
        weighted_average([a, {"v": torch.zeros(2)}])
