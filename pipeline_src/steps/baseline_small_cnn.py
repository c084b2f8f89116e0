"""baseline_small_cnn: a strong reference that needs no pretraining, trained as the methods are.

A small convolutional network of our own (`SmallCNN`: three conv-BN-ReLU stages, max-pooling
after the first two, average pooling to a 3x3 map and a linear head; 26k parameters for one channel
and five classes) trained from random init on the study's target images under the methods' protocol
(issue 42 §3): the study's `train:` epochs, batch size, weight decay and schedule, AdamW
(`methods/training.fit`), each learning rate of the search's grid `search.lrs` (the paper's
{1e-3, 1e-4}) from the same init; the rate of the best *val* accuracy is chosen (ties: the first
in grid order, as `select`), and only its model sees the test split. One job per run seed: the
seed varies the init (`plan/job_settings.init_seed`, as the methods' heads) and the batch order
(`steps/train.shard_seed`, as their full-data models). Its rows share the metrics schema (method
`small-cnn`, kind `baseline`, as an N = 1 model), so Table 1 shows it beside `pixel-logreg`, and
its test predictions are per-image records for the claims' paired tests.
"""
from __future__ import annotations

import json
import time

import numpy as np
import torch
from torch import nn

from pipeline_src.data.sample_store import SampleStore, StoredImages
from pipeline_src.methods.training import batched_apply, fit
from pipeline_src.plan.job_settings import init_seed
from pipeline_src.runner.runtime import resolve_device, set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.train import shard_seed
from pipeline_src.store.metrics import metric_rows, write_metrics
from pipeline_src.store.per_image import per_image_output, per_image_rows, write_per_image

METHOD = "small-cnn"
WIDTHS = (16, 32, 64)  # channels of the three stages
POOLED = 3  # side of the map the head reads: where on the image a feature fired still counts


class SmallCNN(nn.Module):
    """conv3x3-BN-ReLU stages of `widths` channels, each but the last followed by 2x2 max-pooling
    while the map is at least 4 px (so any `dataset.img_size` >= 4 works and the last stage keeps
    2x2 or more: batch norm then has several values per channel even in a batch of one), average
    pooling to a `POOLED` x `POOLED` map and a linear head. Designed on the far Fashion study's target
    *val* split (lr 1e-3, seed 0; 2026-11-28): global average pooling instead 78.2 % (widths 32, 64,
    128: 79.1 %, 94k parameters), a flattened 7x7 map 80.6 %, this 81.0 %.

    Args:
        in_chans: image channels.
        num_classes: outputs.
        img_size: the stored images' side.
        widths: channels per stage.
    """

    def __init__(self, in_chans: int, num_classes: int, img_size: int, widths: tuple[int, ...] = WIDTHS) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        side, chans = img_size, in_chans
        for i, width in enumerate(widths):
            layers += [nn.Conv2d(chans, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
            if i < len(widths) - 1 and side >= 4:
                layers.append(nn.MaxPool2d(2))
                side //= 2
            chans = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(POOLED))
        self.head = nn.Linear(chans * POOLED * POOLED, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))  # (B, C, 3, 3) -> (B, 9C) -> (B, classes)


def build_cnn(seed: int, in_chans: int, num_classes: int, img_size: int, dtype: torch.dtype = torch.float32,
              device: torch.device | str = "cpu") -> SmallCNN:
    """A `SmallCNN` whose random init is drawn from `seed` alone (the global generator's state is
    restored after, so nothing else the job draws moves)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmallCNN(in_chans, num_classes, img_size)
    return model.to(device=device, dtype=dtype)


def channel_stats(store: SampleStore, rows: np.ndarray, chunk: int = 1024) -> tuple[list[float], list[float]]:
    """Per-channel mean and std (unbiased) of the [0, 1]-scaled images of these rows, read `chunk`
    images at a time (float64 sums: the job holds one chunk, whatever the split's size)."""
    total = total_sq = None
    n = 0  # values per channel
    for start in range(0, len(rows), chunk):
        x = store.image_rows(rows[start:start + chunk]).to(torch.float64) / 255.0  # (B, C, H, W)
        s, sq = x.sum(dim=(0, 2, 3)), x.square().sum(dim=(0, 2, 3))
        total, total_sq = (s, sq) if total is None else (total + s, total_sq + sq)
        n += x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / n
    std = ((total_sq - n * mean.square()) / max(n - 1, 1)).clamp_min(0).sqrt().clamp_min(1e-6)
    return mean.tolist(), std.tolist()


@torch.no_grad()
def logits_of(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(N, classes) outputs of `model` in eval mode (batch norm's running statistics)."""
    model.eval()
    return batched_apply(model, x, batch_size)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    """Top-1 accuracy of `model` in eval mode."""
    return float((logits_of(model, x, batch_size).argmax(1) == y).double().mean())


def train_and_select(data: dict[str, tuple[torch.Tensor, torch.Tensor]], lrs: list[float], train: dict, *,
                     init: int, order: int, num_classes: int, eval_batch_size: int = 256,
                     dtype: torch.dtype = torch.float32) -> tuple[float, SmallCNN, dict[float, float]]:
    """Train one CNN per learning rate from the same init and keep the one of the best val accuracy.

    Args:
        data: split -> (normalised images (N, C, H, W): a tensor or a `StoredImages` view, labels);
            "train" and "val" are read, never "test".
        lrs: the learning-rate grid, in its order (ties go to the first).
        train: the study's `train:` settings (epochs, batch_size, weight_decay, schedule).
        init: the init seed; order: the batch-order seed (the same for every rate).
        num_classes: outputs.
        eval_batch_size: images per validation forward pass.
        dtype: the models' dtype (float64 in tests).
    Returns:
        The chosen rate, its trained model (eval mode), and every rate's val accuracy.
    """
    (x, y), (xv, yv) = data["train"], data["val"]
    best: tuple[float, SmallCNN] | None = None
    val_acc: dict[float, float] = {}
    for lr in lrs:
        model = build_cnn(init, x.shape[1], num_classes, x.shape[-1], dtype, x.device)
        model.train()
        fit(model, list(model.parameters()), x, y, epochs=train["epochs"], batch_size=train["batch_size"], lr=lr,
            weight_decay=train["weight_decay"], seed=order, desc=f"{METHOD} lr {lr:g}", schedule=train["schedule"])
        val_acc[lr] = accuracy(model, xv, yv, eval_batch_size)
        if best is None or val_acc[lr] > val_acc[best[0]]:
            best = (lr, model)
    assert best is not None, "search.lrs is never empty (schema: minItems 1)"
    return best[0], best[1], val_acc


def main(args: StepArgs) -> None:
    cfg = args.settings
    seed = int(args.wildcards["seed"])
    set_up_job(args.threads, seed)
    device = resolve_device(args.runtime.get("device") or "auto")
    t0 = time.perf_counter()
    store = SampleStore(args.input.samples)
    splits = {s: store.split("target", s) for s in ("train", "val", "test")}
    if not splits["val"].ids:
        raise ValueError("baselines.small_cnn: the target task has no val split to choose the learning rate on "
                         "(dataset.val_fraction is 0)")
    mean, std = channel_stats(store, splits["train"].rows)  # the training images' own
    # views that read and normalise a batch's images when it is drawn: the job holds a few batches
    data = {s: (StoredImages(store, sub.ids, mean, std, device), sub.labels.to(device)) for s, sub in splits.items()}
    eval_batch = int(args.runtime.get("eval_batch_size") or 256)
    lrs = list(cfg["search"]["lrs"])
    lr, model, val_acc = train_and_select({s: data[s] for s in ("train", "val")}, lrs, cfg["train"],
                                          init=init_seed(cfg["seed"], seed), order=shard_seed(seed, 0),
                                          num_classes=store.num_classes("target"), eval_batch_size=eval_batch)
    test_logits = logits_of(model, data["test"][0], eval_batch)  # the chosen rate's model only
    test_acc = float((test_logits.argmax(1) == data["test"][1]).double().mean())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{METHOD} seed {seed} ({n_params} parameters): val accuracy per lr {val_acc}; chosen lr {lr:g}: "
          f"test accuracy {test_acc:.4f}")
    variant = json.dumps({"lr": lr, "lr_grid": lrs})
    rows = []
    for split, acc in (("val", val_acc[lr]), ("test", test_acc)):
        # as a method's N = 1 model (shard 0 of 1), so Table 1's queries of full-data models find it
        context = dict(experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method=METHOD,
                       kind="baseline", model="shard", shards=1, shard_id=0, seed=seed, split=split,
                       num_samples=len(splits[split].ids), variant=variant)
        rows += metric_rows({"accuracy": acc}, context=context, device=device,
                            wall_time_s=time.perf_counter() - t0)
    test_context = context  # the loop's last: the test split's
    # the claims' paired tests compare a method with the reference image by image (test split only)
    write_per_image(per_image_rows(test_logits.cpu(), splits["test"].labels, splits["test"].ids, test_context),
                    per_image_output(args.output))
    write_metrics(rows, args.output.metrics)
