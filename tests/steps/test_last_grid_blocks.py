"""The LAST grid reads the union of its members' blocks from a `blocks` cache that keeps only
those: each member sees exactly the blocks it would compute itself (every 2 and 4 of depth 4:
blocks 0, 2, 4), so its test predictions equal those of the same side network run on images."""
from __future__ import annotations

import duckdb
import pyarrow.parquet as pq
import torch

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.plan.feature_budget import side_everys
from pipeline_src.plan.forget import train_ids
from pipeline_src.plan.sharding import shard_manifest
from tests.steps.helpers import folder_config, run_features, run_prepare, step_args, write_backbone


def test_grid_members_of_different_spacings_share_one_reduced_cache(tmp_path, image_folder):
    from pipeline_src.steps import last_grid

    cfg = folder_config(image_folder, last_grid={"enabled": True, "method": "last", "every": [2, 4], "lrs": [0.01]},
                        features={"dtype": "float32"})
    results = tmp_path / "results"
    samples = run_prepare(cfg, results)
    write_backbone(results / "pretrain")
    assert side_everys(cfg) == [2, 4]
    feats = run_features(cfg, results, "blocks", everys=side_everys(cfg))
    manifest = results / "split" / "n1_s0" / "shard0.parquet"
    manifest.parent.mkdir(parents=True)
    pq.write_table(shard_manifest(train_ids(pq.read_table(samples)), 1, 0), manifest)
    out = results / "metrics" / "last_grid" / "last" / "n1_s0.parquet"
    last_grid.main(step_args(cfg, inputs={"samples": samples, "backbone": results / "pretrain" / "model.safetensors",
                                          "manifest": manifest, "features": feats}, outputs={"metrics": out},
                             wildcards={"method": "last", "shards": "1", "seed": "0"}, rule="last_grid"))
    rows = duckdb.sql(f"SELECT variant, split, value FROM read_parquet('{out}') WHERE metric = 'accuracy'").fetchall()
    assert len(rows) == 2 * 2  # two members (g = 2, 4) on val and test
    assert all(0 <= v <= 1 for _, _, v in rows)


def test_side_model_from_cache_equals_from_images(tmp_path, image_folder):
    from pipeline_src.methods.registry import build_tuned_model
    from pipeline_src.steps.features import load_rows

    cfg = folder_config(image_folder, features={"dtype": "float32"})
    results = tmp_path / "results"
    run_prepare(cfg, results)
    write_backbone(results / "pretrain")
    feats = run_features(cfg, results, "blocks", everys=[2, 4])
    backbone, record = load_backbone(results / "pretrain")
    store = SampleStore(results / "prepare" / "samples.parquet")
    ids = store.ids("target", "test")
    for every in (2, 4):
        model = build_tuned_model(backbone, {"kind": "last", "rank": 4, "heads": 2, "every": every}, 3, 0).eval()
        with torch.no_grad():
            cached = model.forward_from_prefix(load_rows(feats, store.rows(ids), model))
            computed = store.apply(model, ids, record["mean"], record["std"])
        torch.testing.assert_close(cached, computed, rtol=1e-5, atol=1e-5)
