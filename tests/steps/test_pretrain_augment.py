"""The pretrain step with `backbone.pretrain.augment` (issue 42, section 3): the crops change what
the backbone learns, a seed replays it, and the record and settings carry the recipe."""
from __future__ import annotations

import json

import torch
import yaml
from safetensors.torch import load_file

from pipeline_src.plan.config import validate_config
from tests.conftest import REPO
from tests.steps.helpers import run_prepare, step_args


def pretrain(cfg: dict, results, name: str) -> dict[str, torch.Tensor]:
    from pipeline_src.steps import pretrain as step

    out = results / name
    step.main(step_args(cfg, inputs={"samples": results / "prepare" / "samples.parquet"},
                        outputs={"model": out / "model.safetensors", "record": out / "backbone.json",
                                 "source_ids": out / "source_ids.txt", "metrics": out / "metrics.parquet"},
                        rule="pretrain"))
    torch.set_num_threads(1)
    return load_file(out / "model.safetensors")


def config(augment: dict) -> dict:
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["backbone"]["pretrain"] = {"epochs": 1, "batch_size": 64, "lr": 0.002, "augment": augment}
    return validate_config(cfg, count_samples=False)


def test_crops_change_the_backbone_and_a_seed_replays_it(tmp_path):
    plain, crops = config({}), config({"enabled": True, "pad": 1})
    assert plain["backbone"]["pretrain"]["augment"] == {"enabled": False, "pad": 2, "flip": True}  # defaults
    run_prepare(plain, tmp_path)
    a, b, c = pretrain(plain, tmp_path, "plain"), pretrain(crops, tmp_path, "crops"), pretrain(crops, tmp_path, "again")
    assert not torch.allclose(a["patch_embed.proj.weight"], b["patch_embed.proj.weight"], atol=1e-4)
    for name in b:  # float32 training replayed: the same draws, up to the kernels' rounding
        torch.testing.assert_close(b[name], c[name], rtol=1e-4, atol=1e-5)
    recipe = json.loads((tmp_path / "crops" / "backbone.json").read_text())["recipe"]  # how the backbone was made
    assert recipe["augment"] == {"enabled": True, "pad": 1, "flip": True} and recipe["seed"] == 0
