"""The vectorized training step reads the shards it trains from its outputs (plan/vectorized.py)."""
from __future__ import annotations

import pytest

from pipeline_src.steps.train_vectorized import output_shards


def test_the_vectorized_step_trains_the_shards_its_outputs_name():
    assert output_shards(["r/train/fc/n4_s0/shard0.safetensors", "r/train/fc/n4_s0/shard3.safetensors"]) == [0, 3]
    with pytest.raises(ValueError, match=r"'r/train/fc/n4_s0/model.safetensors' is not a shard"):
        output_shards(["r/train/fc/n4_s0/model.safetensors"])
