"""Choose the embedded backbone's pretraining recipe on validation figures only (issue 42, section 3).

Pretrains a timm ViT on a prepared study's *source* task (its `prepare/samples.parquet`), then
scores it two ways, neither of which reads a test image:
- the source task's val accuracy (what `pretrain` records);
- a linear probe on the *target* train split's frozen features (the class token before the head),
  its inverse L2 strength chosen on, and its accuracy reported for, the target *val* split: how far
  FC, the pipeline's linear probe, can get from this backbone.

Augmentation `cropflip` is the classic small-image recipe: a random crop of the image zero-padded by
`--pad` pixels, and a horizontal flip with probability 1/2, drawn per image from the seeded generator.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/pretrain_recipe.py \
        --samples results/fashion-near/prepare/samples.parquet --patch 4 --dim 96 --epochs 30 \
        --augment cropflip --out results/bench/pretrain_recipe.parquet

Each call appends one row (recipe, sizes, both accuracies, the probe's chosen C, seconds per epoch,
threads, CPU) to `--out`.
"""
from __future__ import annotations

import argparse
import math
import platform
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.data.crop_flip import crop_flip  # backbone.pretrain.augment's, with its draws
from pipeline_src.data.sample_store import SampleStore

MEAN, STD = 0.5, 0.5  # the embedded backbone's normalisation (data/backbone.py EMBEDDED_MEAN_STD)
C_GRID = (0.01, 0.1, 1.0, 10.0)


def images(store: SampleStore, task: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images as normalised float32 (n, C, H, W), labels) of one task's split."""
    sub = store.split(task, split)
    return (sub.images.float() / 255.0 - MEAN) / STD, sub.labels


def pretrain(model: VisionTransformer, x: torch.Tensor, y: torch.Tensor, a: argparse.Namespace) -> float:
    """AdamW with a cosine schedule per step; returns seconds per epoch."""
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.wd)
    gen = torch.Generator().manual_seed(a.seed)
    steps = a.epochs * math.ceil(len(x) / a.batch)
    warmup = min(steps // 10, 500) if a.warmup else 0
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))))
    model.train()
    t0 = time.perf_counter()
    for epoch in range(a.epochs):
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for start in range(0, len(x), a.batch):
            idx = order[start:start + a.batch]
            xb = crop_flip(x[idx], a.pad, True, [-MEAN / STD] * x.shape[1], gen) if a.augment == "cropflip" else x[idx]
            loss = torch.nn.functional.cross_entropy(model(xb), y[idx], label_smoothing=a.smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch + 1}/{a.epochs}: loss {total / len(x):.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return (time.perf_counter() - t0) / a.epochs


@torch.no_grad()
def features(model: VisionTransformer, x: torch.Tensor) -> np.ndarray:
    model.eval()
    return torch.cat([model.forward_head(model.forward_features(x[i:i + 512]), pre_logits=True)
                      for i in range(0, len(x), 512)]).double().numpy()


@torch.no_grad()
def accuracy(model: VisionTransformer, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    pred = torch.cat([model(x[i:i + 512]).argmax(-1) for i in range(0, len(x), 512)])
    return float((pred == y).double().mean())


def probe(ftr: np.ndarray, ytr: np.ndarray, fval: np.ndarray, yval: np.ndarray) -> tuple[float, float]:
    """(val accuracy, C) of the logistic regression whose C is best on val."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scale = StandardScaler().fit(ftr)
    best = (-1.0, None)
    for c in C_GRID:
        model = LogisticRegression(C=c, max_iter=2000).fit(scale.transform(ftr), ytr)
        best = max(best, (float((model.predict(scale.transform(fval)) == yval).mean()), c))
    return best


def finetune(backbone: VisionTransformer, data: dict, lr: float, seed: int, epochs: int = 30) -> float:
    """Full fine-tuning from the backbone with a new head, the TAFT paper's App. A protocol (batch 32,
    lr / 10 at epochs 15 and 25, scaled to `epochs`), as the pipeline's `full` method; its target val accuracy."""
    import copy

    (x, y), (xv, yv) = data["train"], data["val"]
    model = copy.deepcopy(backbone)
    torch.manual_seed(seed)
    model.reset_classifier(int(y.max()) + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [epochs // 2, epochs * 5 // 6], 0.1)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), 32):
            idx = order[start:start + 32]
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sched.step()
    return accuracy(model, xv, yv)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", required=True)
    p.add_argument("--patch", type=int, default=7)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--mlp", type=float, default=2.0)
    p.add_argument("--pool", choices=["token", "avg"], default="token", help="what feeds the head (backbone.arch.global_pool)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--warmup", action="store_true", help="linear warm-up over 10 %% of the steps (at most 500)")
    p.add_argument("--smoothing", type=float, default=0.0, help="label smoothing")
    p.add_argument("--augment", choices=["none", "cropflip"], default="none")
    p.add_argument("--pad", type=int, default=2)
    p.add_argument("--limit", type=int, default=None, help="use the first LIMIT source training images only")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--finetune", type=str, default="", help="comma-separated lrs: also fine-tune the whole model "
                   "on the target task at each and report the best target val accuracy (the `full` method)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    store = SampleStore(a.samples)
    xs, ys = images(store, "source", "train")
    if a.limit:
        xs, ys = xs[:a.limit], ys[:a.limit]
    model = VisionTransformer(img_size=xs.shape[-1], in_chans=xs.shape[1], patch_size=a.patch, embed_dim=a.dim,
                              depth=a.depth, num_heads=a.heads, mlp_ratio=a.mlp, global_pool=a.pool, num_classes=store.num_classes("source"))
    s_per_epoch = pretrain(model, xs, ys, a)
    source_val = accuracy(model, *images(store, "source", "val"))
    (xt, yt), (xv, yv) = images(store, "target", "train"), images(store, "target", "val")
    probe_val, c = probe(features(model, xt), yt.numpy(), features(model, xv), yv.numpy())
    finetune_val, finetune_lr = float("nan"), None
    for lr in [float(v) for v in a.finetune.split(",") if v]:
        acc = finetune(model, {"train": (xt, yt), "val": (xv, yv)}, lr, a.seed)
        print(f"full fine-tuning at lr {lr:g}: target val {acc:.4f}", flush=True)
        if not acc <= finetune_val:  # the first, or a better one
            finetune_val, finetune_lr = acc, lr
    row = dict(samples=a.samples, patch=a.patch, dim=a.dim, depth=a.depth, heads=a.heads, mlp=a.mlp, pool=a.pool, epochs=a.epochs,
               batch=a.batch, lr=a.lr, wd=a.wd, warmup=a.warmup, smoothing=a.smoothing, augment=a.augment, pad=a.pad,
               source_train=len(xs), target_train=len(yt), target_val=len(yv), source_val_acc=source_val,
               probe_val_acc=probe_val, probe_c=c,
               finetune_val_acc=finetune_val, finetune_lr=finetune_lr, s_per_epoch=s_per_epoch, threads=a.threads, seed=a.seed,
               cpu=platform.processor() or platform.machine(), torch=torch.__version__)
    print(row)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([row])
    if out.exists():
        table = pa.concat_tables([pq.read_table(out), table], promote_options="default")
    tmp = out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)


if __name__ == "__main__":
    main()
