"""The cache budget at validation: sizes from the config alone, and a refusal naming the cache."""
from __future__ import annotations

import pytest

from pipeline_src.plan.config import ConfigError, validate_config
from pipeline_src.plan.feature_budget import (
    budget_report,
    cache_sizes,
    image_store_line,
    kept_blocks,
    side_everys,
    timm_shape,
)


@pytest.mark.parametrize("name,shape", [
    ("vit_base_patch16_224.augreg_in21k", (197, 768, 12)),
    ("vit_tiny_patch16_224", (197, 192, 12)),
    ("vit_large_patch14_clip_336.openai", (577, 1024, 24)),
    ("deit_small_distilled_patch16_224", (198, 384, 12)),
    ("vit_base_patch32_384", (145, 768, 12)),
])
def test_shapes_of_common_timm_names(name, shape):
    s = timm_shape(name)
    assert (s.tokens, s.width, s.depth) == shape


def test_a_timm_name_built_at_the_studys_image_size():
    assert timm_shape("vit_base_patch16_224", img_size=64).tokens == 17  # 4 x 4 patches + CLS
    assert timm_shape("vit_small_patch14_dinov2.lvd142m", img_size=224).tokens == 257  # size from the study


def test_unrecognised_names_are_unknown():
    assert timm_shape("vit_small_patch14_dinov2.lvd142m") is None  # no image size in the name
    assert timm_shape("resnet50") is None


def test_a_last_method_without_every_reads_lasts_default_spacing():
    cfg = base_b16_cfg({})
    cfg["methods"]["last"].pop("every")
    cfg["last_grid"]["enabled"] = False
    assert side_everys(cfg) == [2]  # LAST_DEFAULTS' g = 2, as the method builds it: 7 blocks of 13
    assert kept_blocks(12, side_everys(cfg)) == [0, 2, 4, 6, 8, 10, 12]


def test_kept_blocks_are_what_last_reads():
    assert kept_blocks(12, [1]) == list(range(13))
    assert kept_blocks(12, [4]) == [0, 4, 8, 12]
    assert kept_blocks(12, [4, 6]) == [0, 4, 6, 8, 12]
    with pytest.raises(ValueError, match="every=5"):
        kept_blocks(12, [5])


def base_b16_cfg(features: dict) -> dict:
    """A validated-looking config of a ViT-B/16 study (no file checks: the budget reads only these keys)."""
    return {"backbone": {"source": "timm", "timm_name": "vit_base_patch16_224.augreg_in21k"},
            "dataset": {"img_size": 224},
            "methods": {"taft-1": {"kind": "taft", "k": 1}, "last": {"kind": "last", "rank": 8, "heads": 2, "every": 4}},
            "last_grid": {"enabled": True, "method": "last", "every": [4, 6], "lrs": [], "ranks": [], "heads": [],
                          "modules_per_block": [], "init_seeds": []},
            "train": {"lr": 1e-3},
            "features": {"cache": True, "dtype": "float16", "max_cache_gb": 100, **features}}


def test_sizes_of_a_caltech256_scale_study():
    cfg = base_b16_cfg({})
    assert side_everys(cfg) == [4, 6]
    sizes = cache_sizes(cfg, 30_000)
    assert sizes["last1"] == 30_000 * 197 * 768 * 2  # 9.1 GB in float16 (18 GB in float32)
    assert sizes["blocks"] == 30_000 * 5 * 197 * 768 * 2  # blocks 0, 4, 6, 8, 12 only, not 13
    lines, error = budget_report(cfg, 30_000)
    assert error is None and any("'blocks': 45.4 GB" in line and "[0, 4, 6, 8, 12]" in line for line in lines)


def test_a_study_over_the_budget_is_refused_naming_the_cache():
    _, error = budget_report(base_b16_cfg({"max_cache_gb": 20}), 30_000)
    assert "'blocks' feature cache would take about 45.4 GB" in error and "features.cache: false" in error
    assert budget_report(base_b16_cfg({"max_cache_gb": 20, "cache": False}), 30_000) == ([], None)


def test_validation_refuses_the_default_study_under_a_tiny_budget():
    import yaml

    from tests.conftest import REPO

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    with pytest.raises(ConfigError, match=r"features.max_cache_gb.*'blocks' feature cache.*features.cache: false"):
        validate_config({**cfg, "features": {"max_cache_gb": 0.001}})
    validate_config({**cfg, "features": {"max_cache_gb": 0.001, "cache": False}})


def test_the_image_store_size_is_stated_too():
    cfg = {**base_b16_cfg({}), "experiment": "big", "dataset": {"img_size": 224, "in_chans": 3}}
    line = image_store_line(cfg, 30_000)  # 30,000 x 3 x 224 x 224 bytes
    assert "'results/big/prepare/images.npy': 4.52 GB (30000 images x 3 x 224 x 224 x uint8)" in line
