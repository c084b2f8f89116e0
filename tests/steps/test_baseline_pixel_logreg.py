"""The pixel logistic-regression reference: C chosen on val only, its rows in the metrics schema."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline_src.steps.baseline_pixel_logreg import C_GRID, select_c
from tests.conftest import REPO, snakemake


def test_c_is_chosen_on_val_and_is_its_best():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x, xv = rng.normal(size=(120, 6)), rng.normal(size=(60, 6))
    w = rng.normal(size=(6, 3))
    y, yv = (x @ w).argmax(1), (xv @ w).argmax(1)
    yv_noisy = yv.copy()
    yv_noisy[:20] = (yv_noisy[:20] + 1) % 3
    c, model, val_acc = select_c(x, y, xv, yv_noisy)
    expected = {g: float((LogisticRegression(C=g, max_iter=1000).fit(x, y).predict(xv) == yv_noisy).mean()) for g in C_GRID}
    assert val_acc == expected
    assert c == min(g for g in C_GRID if expected[g] == max(expected.values()))
    assert model.C == c


def test_the_rule_writes_val_and_test_rows(tmp_path):
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["baselines"] = {"pixel_logreg": True}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = f"results/{cfg['experiment']}/metrics/baselines/pixel_logreg.parquet"
    snakemake(tmp_path, out, "--cores", "1", "--configfile", str(tmp_path / "config.yaml"), timeout=600)
    rows = pq.read_table(tmp_path / out).to_pandas().set_index("split")
    assert set(rows.index) == {"val", "test"} and set(rows.method) == {"pixel-logreg"}
    assert (rows.metric == "accuracy").all() and (rows.shards == 1).all()
    assert 0.6 < rows.value["test"] <= 1.0  # digits 5-9 from 8x8 pixels: far above chance (0.2)
    images = pq.read_table(tmp_path / out.replace("/metrics/", "/per_image/")).to_pandas()  # the paired tests'
    assert set(images.split) == {"test"} and images.sample_id.is_unique and set(images.method) == {"pixel-logreg"}
    assert len(images) == rows.num_samples["test"] and images.correct.mean() == pytest.approx(rows.value["test"])
