"""Forget requests (reading, validation, shard assignment) and exact TAFT subtraction."""
from __future__ import annotations

import pyarrow as pa
import pytest
import torch
import yaml

from pipeline_src.methods.composition import subtract_shards
from pipeline_src.methods.registry import build_tuned_model, get_method
from pipeline_src.plan.forget import (
    ForgetRequestError,
    forgotten_by_shard,
    forgotten_in_shard,
    random_request,
    random_shards,
    read_request,
    remove_ids,
    samples_table,
    shard_members,
    train_ids,
    validate_request,
)
from pipeline_src.plan.samples import SAMPLES_SCHEMA
from pipeline_src.plan.sharding import shard_ids, shard_manifest
from pipeline_src.taft.compose import compose_deltas
from tests.conftest import REPO, tiny_vit


def _samples() -> pa.Table:
    rows = [("d/5/0", "target", "train"), ("d/5/1", "target", "train"), ("d/6/2", "target", "test"),
            ("d/6/3", "target", "val"), ("d/0/4", "source", "train"), ("d/6/5", "target", "train")]
    return pa.Table.from_pydict({
        "sample_id": [r[0] for r in rows], "row": list(range(len(rows))), "task": [r[1] for r in rows],
        "split": [r[2] for r in rows], "label": [0] * len(rows), "class_name": ["x"] * len(rows)}, schema=SAMPLES_SCHEMA)


def test_request_files_text_and_csv(tmp_path):
    (tmp_path / "r.txt").write_text("# forget these\nd/5/1\n\nd/5/0\n")
    (tmp_path / "r.csv").write_text("label,sample_id\n3,d/5/1\n4,d/5/0\n")
    (tmp_path / "one.csv").write_text("d/5/1\nd/5/0\n")
    for name in ("r.txt", "r.csv", "one.csv"):
        assert sorted(read_request(tmp_path / name)) == ["d/5/0", "d/5/1"]
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ForgetRequestError, match="sample_id"):
        read_request(tmp_path / "bad.csv")
    with pytest.raises(ForgetRequestError, match="not found"):
        read_request(tmp_path / "missing.txt")


@pytest.mark.parametrize("name, text", [("r.txt", "d/5/1\nd/5/0\n"), ("r.csv", "sample_id\nd/5/1\nd/5/0\n"),
                                        ("one.csv", "d/5/1\nd/5/0\n")])
def test_request_files_saved_with_a_byte_order_mark(tmp_path, name, text):
    """An editor's UTF-8 BOM is invisible: the first id (or the CSV header) must not carry it."""
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    ids = read_request(tmp_path / name)
    assert ids == ["d/5/1", "d/5/0"]
    assert validate_request(ids, _samples()) == ["d/5/0", "d/5/1"]


@pytest.mark.parametrize("ids, message", [
    (["d/5/0", "d/5/0"], "duplicate sample id 'd/5/0'"),
    (["d/5/0", "nope/1"], "unknown sample id 'nope/1'"),
    (["d/6/2"], "'d/6/2' is in the test split"),
    (["d/6/3"], "'d/6/3' is in the val split"),
    (["d/0/4"], "'d/0/4' belongs to the source"),
])
def test_bad_requests_name_the_offending_id(ids, message):
    with pytest.raises(ForgetRequestError, match=message):
        validate_request(ids, _samples())


def test_valid_request_is_sorted():
    assert validate_request(["d/6/5", "d/5/0"], _samples()) == ["d/5/0", "d/6/5"]


def _tiny_cfg(tmp_path, request_ids) -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    (tmp_path / "forget.txt").write_text("\n".join(request_ids) + "\n")
    cfg["forget"] = {"requests": str(tmp_path / "forget.txt")}
    return cfg


def _validate(cfg: dict) -> dict:
    from pipeline_src.plan.config import validate_config
    from pipeline_src.plan.forget import check_forget_section

    cfg = validate_config(cfg)  # raises here already once config.py calls check_forget_section
    check_forget_section(cfg)
    return cfg


def test_config_validation_rejects_bad_requests_naming_key_and_id(tmp_path):
    from pipeline_src.plan.config import ConfigError, validate_config

    samples = samples_table(validate_config(yaml.safe_load((REPO / ".test" / "config.yaml").read_text())))
    t = samples.to_pydict()
    test_id = next(i for i, tk, s in zip(t["sample_id"], t["task"], t["split"]) if tk == "target" and s == "test")
    train = train_ids(samples)
    for ids, expect in ([train[0], test_id], test_id), ([train[3], train[3]], train[3]), (["digits/x/9"], "digits/x/9"):
        with pytest.raises(ConfigError, match=f"forget.requests.*{expect}"):
            _validate(_tiny_cfg(tmp_path, ids))
    cfg = _validate(_tiny_cfg(tmp_path, train[:3]))
    assert cfg["forget"]["study"]["enabled"] is False


def test_forgotten_ids_go_to_their_shards_only(tmp_path):
    from pipeline_src.plan.config import validate_config

    cfg = validate_config(yaml.safe_load((REPO / ".test" / "config.yaml").read_text()))
    train = train_ids(samples_table(cfg))
    request = random_request(train, 0.01, seed=0, request=0)
    cfg = _validate(_tiny_cfg(tmp_path, request))
    manifest = shard_manifest(train, 5, 3)
    expected = forgotten_by_shard(manifest, request)
    got = {s: forgotten_in_shard(cfg, 5, 3, s) for s in range(5)}
    assert {s: v for s, v in got.items() if v} == expected
    assert sum(len(v) for v in got.values()) == len(request)
    for s in range(5):  # the shard manifest after forgetting: its ids minus exactly the forgotten ones
        kept = remove_ids(manifest, got[s])
        assert set(shard_ids(kept, s)) == set(shard_ids(manifest, s)) - set(request)


def test_an_edited_request_file_is_read_again_in_the_same_process(tmp_path):
    """The forget manifests' params are cached per request file: a request edited between two
    plans of one process (two dry runs through the API) must not keep the old params."""
    from pipeline_src.plan.config import validate_config

    cfg = validate_config(yaml.safe_load((REPO / ".test" / "config.yaml").read_text()))
    manifest = shard_manifest(train_ids(samples_table(cfg)), 2, 0)
    first, second = shard_ids(manifest, 0)[:2]
    cfg = _validate(_tiny_cfg(tmp_path, [first]))
    assert forgotten_in_shard(cfg, 2, 0, 0) == [first]
    cfg = _validate(_tiny_cfg(tmp_path, [first, second]))  # rewrites the same request file
    assert forgotten_in_shard(cfg, 2, 0, 0) == sorted([first, second])


def test_a_dataset_changed_on_disk_changes_the_shard_members_of_the_next_plan(image_folder):
    """Two plans in one process (two dry runs through the API): validation lists the dataset again,
    and the manifests' members follow it; a cache on the config alone kept the first plan's."""
    import numpy as np
    from PIL import Image

    from pipeline_src.plan.config import validate_config

    raw = {"experiment": "members", "dataset": {"source": "imagefolder", "path": str(image_folder), "img_size": 8},
           "backbone": {"source": "timm", "timm_name": "vit_tiny_patch16_224"},
           "methods": {"fc": {"kind": "fc"}}, "shards": [1]}
    cfg = validate_config(raw)
    before = shard_members(cfg, 1, 0, 0)
    assert before == shard_members(validate_config(raw), 1, 0, 0)  # nothing changed: the same members
    for i in range(8):  # a few: the keyed split puts most of them in train
        Image.fromarray(np.full((12, 12), i, dtype=np.uint8)).save(image_folder / "circle" / f"new{i}.png")
    cfg = validate_config(raw)  # the next plan validates first, as the Snakefile does
    after = shard_members(cfg, 1, 0, 0)
    assert set(before) < set(after) and all("new" in i for i in set(after) - set(before))


def test_random_requests_and_shards_are_reproducible():
    ids = [f"i{k:03d}" for k in range(200)]
    a, b = random_request(ids, 0.05, 1, 2), random_request(list(reversed(ids)), 0.05, 1, 2)
    assert a == b and len(a) == 10 and len(set(a)) == 10
    assert random_request(ids, 0.05, 1, 3) != a
    assert len(random_request(ids, 1e-6, 0, 0)) == 1
    assert random_shards(10, 3, 0, 1) == random_shards(10, 3, 0, 1) and len(set(random_shards(10, 3, 0, 1))) == 3


# ---------------------------------------------------------------- exactness of TAFT-subtract
@pytest.fixture(scope="module")
def tangent_shards(float64_default):
    """Four tiny tangent models, each trained (a few real steps) on its own shard of random data."""
    backbone = tiny_vit()
    method_cfg = {"kind": "taft", "k": 1, "l2": 1e-5}
    torch.manual_seed(1)
    x = torch.randn(48, 1, 16, 16)
    y = torch.randint(0, 5, (48,))
    settings = {"epochs": 3, "batch_size": 8, "lr": 0.05, "weight_decay": 0.0, "method": method_cfg}
    states = []
    for shard in range(4):
        model = build_tuned_model(backbone, method_cfg, 5, seed=0)
        idx = torch.arange(shard, 48, 4)
        get_method("taft").train(model, model.prefix(x[idx]), y[idx], settings, 100 + shard, f"shard {shard}")
        states.append(model.trainable_state())
    return backbone, method_cfg, states, x


def _logits(backbone, method_cfg, state, x):
    model = build_tuned_model(backbone, method_cfg, 5, seed=0).eval()
    model.load_trainable_state(state)
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("weights", [[0.25] * 4, [0.1, 0.2, 0.3, 0.4]])
@pytest.mark.parametrize("remove", [[2], [0, 3]])
def test_subtracting_shards_equals_composing_the_others(tangent_shards, weights, remove):
    backbone, method_cfg, states, x = tangent_shards
    assert all(not torch.equal(states[0][k], states[1][k]) for k in states[0])  # really trained apart
    composed = compose_deltas(states, weights)
    state, kept, kept_w = subtract_shards(composed, dict(enumerate(states)), weights, [0, 1, 2, 3], remove)
    others = [i for i in range(4) if i not in remove]
    assert kept == others
    ref_w = [weights[i] / sum(weights[j] for j in others) for i in others]
    assert kept_w == pytest.approx(ref_w, abs=1e-12)
    direct = compose_deltas([states[i] for i in others], ref_w)
    for k in direct:  # weights
        torch.testing.assert_close(state[k], direct[k], rtol=1e-10, atol=1e-12)
    # outputs, against the explicit weighted ensemble of the kept models' logits
    ensemble = sum(w * _logits(backbone, method_cfg, states[i], x) for w, i in zip(ref_w, others))
    torch.testing.assert_close(_logits(backbone, method_cfg, state, x), ensemble, rtol=1e-9, atol=1e-9)


def test_subtracting_a_shard_twice_is_refused(tangent_shards):
    _, _, states, _ = tangent_shards
    composed = compose_deltas(states, [0.25] * 4)
    with pytest.raises(ForgetRequestError, match="shard 1 is not a component"):
        subtract_shards(composed, dict(enumerate(states)), [0.25] * 4, [0, 1, 2, 3], [1, 1])


@pytest.mark.parametrize("study, key", [
    ({"methods": ["nope"]}, "forget.study.methods.*'nope'"),
    ({"methods": ["taft-1"], "shards": [3], "removed_shards": [3]}, "forget.study.removed_shards.*3 of 3"),
    ({"methods": ["taft-1"], "forget_fractions": [1.5]}, "forget.study.forget_fractions.*1.5"),
    ({"methods": ["taft-1"], "forget_fractions": [-0.1]}, "forget.study.forget_fractions.*-0.1 is not in"),
])
def test_bad_study_settings_name_their_key(study, key):
    from pipeline_src.plan.config import ConfigError

    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["forget"] = {"study": {"enabled": True, **study}}
    with pytest.raises(ConfigError, match=key):
        _validate(cfg)


def test_nonlinear_paragon_is_the_nlft_counterpart_of_a_tangent_method():
    """TAFT App. C.3: the paragon retrains the non-linear model (taft-k → nlft-k); an nlft-k of
    `methods:` lends its own settings, else the counterpart uses the shared `train:` ones."""
    from pipeline_src.plan.forget import nonlinear_paragon

    cfg = {"methods": {"taft-1": {"kind": "taft", "k": 1, "lr": 0.01}, "taft-2": {"kind": "taft", "k": 2},
                       "nlft-2": {"kind": "nlft", "k": 2, "lr": 0.003}, "nlft-1b": {"kind": "nlft", "k": 1},
                       "last": {"kind": "last", "rank": 8, "heads": 2}}}
    assert nonlinear_paragon(cfg, "taft-2") == ("nlft-2", {"kind": "nlft", "k": 2, "lr": 0.003})
    assert nonlinear_paragon(cfg, "taft-1") == ("nlft-1b", {"kind": "nlft", "k": 1})
    del cfg["methods"]["nlft-1b"]
    assert nonlinear_paragon(cfg, "taft-1") == ("taft-1-nonlinear", {"kind": "nlft", "k": 1})
    assert nonlinear_paragon(cfg, "nlft-2") is None and nonlinear_paragon(cfg, "last") is None


def test_single_sample_requests_touch_one_shard_at_every_n():
    """forget_fractions 0: one person asks to be removed; retrain-shard then retrains one shard at
    N = 10 and 50 (the unlearning-cost claim's requests), where 0.2 % of the data touches several."""
    from pipeline_src.plan.config import validate_config

    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["forget"] = {"study": {"enabled": True, "methods": ["taft-1"], "shards": [10, 50], "forget_fractions": [0, 0.1]}}
    assert validate_config(cfg, count_samples=False)["forget"]["study"]["forget_fractions"] == [0, 0.1]
    ids = [f"d/{i % 10}/{i:04d}" for i in range(4000)]
    for n in (10, 50):
        manifest = shard_manifest(ids, n, seed=0)
        for request in range(5):
            one = random_request(ids, 0, seed=0, request=request)
            assert len(one) == 1 and len(forgotten_by_shard(manifest, one)) == 1
        assert len(forgotten_by_shard(manifest, random_request(ids, 0.1, seed=0, request=0))) == n
    assert len({tuple(random_request(ids, 0, seed=0, request=r)) for r in range(5)}) == 5  # different people


def test_a_request_that_is_not_utf8_names_the_file_and_the_key(tmp_path):
    """Issue 44, 5.6: a Latin-1 file gave a UnicodeDecodeError traceback naming neither."""
    from pipeline_src.plan.config import ConfigError

    cfg = _tiny_cfg(tmp_path, [])
    (tmp_path / "forget.txt").write_bytes("d/5/0\ncaf\xe9/1\n".encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        _validate(cfg)
    message = str(err.value)
    assert message.startswith(f"config key 'forget.requests' ({tmp_path / 'forget.txt'})"), message
    assert "not UTF-8" in message and "line 2" in message


def test_a_huge_line_is_not_echoed_whole(tmp_path):
    """Issue 44, 5.6: a 10 MB line (no line breaks) came back whole in the error."""
    from pipeline_src.plan.config import ConfigError

    cfg = _tiny_cfg(tmp_path, [])
    (tmp_path / "forget.txt").write_text("x" * 10_000_000)
    with pytest.raises(ConfigError, match="forget.requests") as err:
        _validate(cfg)
    assert len(str(err.value)) < 400 and "10,000,000 characters" in str(err.value)
