"""pretrain: produce the backbone every method starts from (and TAFT linearizes around).

For `backbone.source: pretrain` a small timm ViT is trained on the *source* task: the source classes,
disjoint from the downstream task's, or with `dataset.pretrain_pool` a keyed-hash pool of the training
split, disjoint from every target image (`plan/pretrain_pool.py`); otherwise the timm model or
checkpoint is imported. The record says what the backbone saw (`pretrain_data`); the ids it saw go
to the private `source_ids.txt`.
"""
from __future__ import annotations

import time

import torch
from timm.models.vision_transformer import VisionTransformer

from pipeline_src.data.backbone import EMBEDDED_MEAN_STD, embedded_vit_kwargs, external_backbone, save_backbone
from pipeline_src.data.crop_flip import CropFlipInputs
from pipeline_src.data.sample_store import SampleStore, StoredImages
from pipeline_src.methods.training import fit
from pipeline_src.plan.pretrain_pool import pool_record
from pipeline_src.runner.runtime import resolve_device, set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.atomic import write_text
from pipeline_src.store.metrics import metric_rows, write_metrics


def main(args: StepArgs) -> None:
    cfg = args.settings
    set_up_job(args.threads, cfg["seed"])
    device = resolve_device(args.runtime["device"])
    t0 = time.perf_counter()
    if cfg["backbone"]["source"] != "pretrain":
        model, record = external_backbone(cfg)
        img = model.patch_embed.img_size
        if tuple(img) != (cfg["dataset"]["img_size"],) * 2 and not getattr(model, "dynamic_img_size", False):
            raise ValueError(f"config key 'dataset.img_size': backbone expects {tuple(img)} images, "
                             f"dataset gives {cfg['dataset']['img_size']}")
        save_backbone(model, record, args.output.model.rsplit("/", 1)[0])
        write_text("", args.output.source_ids)  # an imported backbone: no sample of this study
        write_metrics([], args.output.metrics)
        return

    store = SampleStore(args.input.samples)
    mean, std = [m * cfg["dataset"]["in_chans"] for m in EMBEDDED_MEAN_STD]
    kwargs = embedded_vit_kwargs(cfg, num_classes=store.num_classes("source"))
    torch.manual_seed(cfg["seed"])
    model = VisionTransformer(**kwargs).to(device)
    train, test = store.split("source", "train"), store.split("source", "test")
    x = StoredImages(store, train.ids, mean, std, device)  # each batch read and converted when drawn
    p = cfg["backbone"]["pretrain"]
    if p["augment"]["enabled"]:  # a black pixel's normalised value pads the crops
        x = CropFlipInputs(x, p["augment"]["pad"], p["augment"]["flip"], [-m / s for m, s in zip(mean, std)], cfg["seed"])
    stats = fit(model, list(model.parameters()), x, train.labels.to(device), epochs=p["epochs"],
                batch_size=p["batch_size"], lr=p["lr"], weight_decay=p["weight_decay"], seed=cfg["seed"], desc="pretrain",
                schedule=p.get("schedule"))
    model.eval()
    logits = store.apply(model, test.ids, mean, std, device, batch_size=args.runtime["eval_batch_size"]).cpu()
    acc = (logits.argmax(-1) == test.labels).double().mean().item()
    val = store.split("source", "val")
    val_acc = float("nan")
    if val.ids:  # the figure a backbone is chosen by (the test figure stays for the report)
        val_logits = store.apply(model, val.ids, mean, std, device, batch_size=args.runtime["eval_batch_size"]).cpu()
        val_acc = (val_logits.argmax(-1) == val.labels).double().mean().item()
    print(f"pretrained on {len(train.ids)} source samples: source val accuracy {val_acc:.4f}, "
          f"source test accuracy {acc:.4f}")
    pool_cfg = cfg["dataset"]["pretrain_pool"]
    record = {"vit_kwargs": kwargs, "mean": mean, "std": std, "source": "pretrain", "recipe": {**p, "seed": cfg["seed"]},
              "pretrain_data": pool_record(store.table, pool_cfg) if pool_cfg else
              {"classes": sorted({c for c, t in zip(store.table.column("class_name").to_pylist(),
                                                    store.table.column("task").to_pylist()) if t == "source"}),
               "count": len(train.ids) + len(val.ids) + len(test.ids)}}
    source_ids = sorted(train.ids + val.ids + test.ids)
    write_text("".join(f"{i}\n" for i in source_ids), args.output.source_ids)  # private workspace
    save_backbone(model.cpu(), record, args.output.model.rsplit("/", 1)[0])
    context = dict(experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method="pretrain", kind="pretrain",
                   model="backbone", shards=1, shard_id=None, seed=cfg["seed"], split="source-test",
                   num_samples=len(test.ids))
    write_metrics(metric_rows({"accuracy": acc, "train_loss": stats["train_loss"]}, context=context, device=device,
                              wall_time_s=time.perf_counter() - t0), args.output.metrics)
