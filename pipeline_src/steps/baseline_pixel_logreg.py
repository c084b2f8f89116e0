"""baseline_pixel_logreg: the reference that needs no pretraining, on the study's own target images.

A multinomial logistic regression on raw pixels (scaled to [0, 1]; scikit-learn's L2-penalised
`LogisticRegression`, lbfgs), its inverse regularisation C chosen on the target *val* split from a
fixed grid, the test accuracy reported for the chosen C only. A backbone whose features lose to
this line transfers negatively (issue 31: the far Fashion-MNIST backbone, 73 % pixels). Its rows
share the metrics schema (method `pixel-logreg`, kind `baseline`), so Table 1 can show them, and its
test predictions are per-image records (`store/per_image.py`) for the claims' paired tests.
"""
from __future__ import annotations

import json
import time

import numpy as np
import torch

from pipeline_src.data.sample_store import SampleStore
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.metrics import metric_rows, write_metrics
from pipeline_src.store.per_image import per_image_output, prediction_rows, write_per_image

C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0)  # inverse L2 strength: a fixed, paper-style decade grid


def pixels(store: SampleStore, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Target images of one split as float64 rows in [0, 1], and their labels."""
    sub = store.split("target", split)
    x = sub.images.numpy().reshape(len(sub.ids), -1).astype(np.float64) / 255.0
    return x, sub.labels.numpy()


def select_c(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray, grid=C_GRID, max_iter: int = 1000):
    """The fitted model of the C with the best val accuracy (the smallest C on a tie), and each C's
    val accuracy.

    Args:
        x, y: training pixels and labels.
        xv, yv: validation pixels and labels (never test).
        grid: the C values tried.
        max_iter: lbfgs iterations.
    """
    from sklearn.linear_model import LogisticRegression

    best, val_acc = None, {}
    for c in grid:
        model = LogisticRegression(C=c, max_iter=max_iter).fit(x, y)
        val_acc[c] = float((model.predict(xv) == yv).mean())
        if best is None or val_acc[c] > val_acc[best[0]]:
            best = (c, model)
    return best[0], best[1], val_acc


def main(args: StepArgs) -> None:
    cfg = args.settings
    t0 = time.perf_counter()
    store = SampleStore(args.input.samples)
    (x, y), (xv, yv), (xt, yt) = (pixels(store, s) for s in ("train", "val", "test"))
    if not len(yv):
        raise ValueError("baselines.pixel_logreg: the target task has no val split to choose C on "
                         "(dataset.val_fraction is 0)")
    c, model, val_acc = select_c(x, y, xv, yv)
    predicted = model.predict(xt)
    test_acc = float((predicted == yt).mean())
    print(f"pixel logistic regression: val accuracy per C {val_acc}; chosen C {c}: test accuracy {test_acc:.4f}")
    rows = []
    for split, acc, n in (("val", val_acc[c], len(yv)), ("test", test_acc, len(yt))):
        # as a method's N = 1 model (shard 0 of 1), so Table 1's queries of full-data models find it
        context = dict(experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method="pixel-logreg",
                       kind="baseline", model="shard", shards=1, shard_id=0, seed=cfg["seed"], split=split,
                       num_samples=n, variant=json.dumps({"C": c, "C_grid": list(C_GRID)}))
        rows += metric_rows({"accuracy": acc}, context=context, device=torch.device("cpu"),
                            wall_time_s=time.perf_counter() - t0)
    test_context = context  # the loop's last: the test split's
    write_per_image(prediction_rows(torch.from_numpy(predicted), torch.from_numpy(yt), store.ids("target", "test"),
                                    test_context), per_image_output(args.output))  # for the claims' paired tests
    write_metrics(rows, args.output.metrics)
