"""train: fine-tune one model on one shard (or, for N = 1, on the whole training split)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch

from pipeline_src.data.augment import AugmentedInputs, train_transform
from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.feature_cache import CachedRows, FeatureCache
from pipeline_src.data.sample_store import SampleStore, StoredImages
from pipeline_src.job.training_memory import training_memory
from pipeline_src.methods.registry import TunedModel, build_tuned_model, get_method
from pipeline_src.plan.job_settings import init_seed, train_settings
from pipeline_src.plan.sharding import shard_ids
from pipeline_src.runner.runtime import resolve_device, set_up_job, use_bf16
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.metrics import peak_memory_mb
from pipeline_src.store.model_io import save_model
from pipeline_src.vit.digest import state_digest

PREFIX_BATCH = 256  # images per no-grad prefix batch when training without a cache (fixed: it may round differently)


def shard_seed(seed: int, shard: int) -> int:
    """Batch-order seed of one shard's training."""
    return seed * 1000 + shard


@dataclass
class TrainingJob:
    """Everything a training job loads once, whatever the number of shards it trains."""

    args: StepArgs
    cfg: dict  # the config as the job may read it (`StepArgs.job_config`)
    name: str
    method_cfg: dict
    settings: dict
    shards: int
    seed: int
    device: torch.device
    backbone: torch.nn.Module
    backbone_record: dict
    store: SampleStore
    manifest: object
    num_classes: int
    head_seed: int
    bf16: bool = False  # bfloat16 autocast of the frozen prefix (train.precision; never for DP jobs)

    def new_model(self) -> TunedModel:
        return build_tuned_model(self.backbone, self.method_cfg, self.num_classes, self.head_seed).to(self.device)

    def shard_data(self, model: TunedModel, shard: int) -> tuple[list[str], CachedRows | StoredImages, torch.Tensor]:
        """(ids, frozen prefix features, labels) of one shard, from the cache when there is one (see `samples_data`)."""
        return self.samples_data(model, shard_ids(self.manifest, shard))

    def samples_data(self, model: TunedModel, ids: list[str],
                     blocks: list[int] | None = None, batch_size: int = PREFIX_BATCH) -> tuple[list[str], CachedRows | StoredImages, torch.Tensor]:
        """(ids, frozen prefix features, labels) of any samples. With a cache the features are a
        `CachedRows` view that reads a batch's rows when indexed (the job holds one batch, not the
        shard); without one a `StoredImages` view that reads a batch's images and runs the frozen prefix
        on them when indexed (every epoch: memory for one batch, not for the shard's features).

        Args:
            model: the tuned model whose prefix the features are.
            ids: sample ids.
            blocks: LAST only: these backbone block outputs instead of the model's own (the grid).
            batch_size: images per batch when computing features without a cache.
        """
        data = self.store.subset(ids)
        if "features" in self.args.input._names:
            features = CachedRows(FeatureCache(self.args.input.features), data.rows, self.device,
                                  blocks=getattr(model, "cache_blocks", None) if blocks is None else blocks)
        else:
            fn = model.prefix if blocks is None else (lambda x: model.prefix_blocks(x, blocks))
            features = StoredImages(self.store, ids, self.backbone_record["mean"], self.backbone_record["std"],
                                    self.device, prefix=fn, autocast=self.bf16, chunk=batch_size)
        return ids, features, data.labels.to(self.device)

    def augmented_data(self, model: TunedModel, shard: int, seed: int) -> tuple[list[str], AugmentedInputs, torch.Tensor]:
        """(ids, prefix features made per batch from augmented images, labels) of one shard (`train.augment`)."""
        ids = shard_ids(self.manifest, shard)
        rec, dataset = self.backbone_record, self.cfg["dataset"]
        transform = train_transform(self.settings["augment"], dataset["img_size"], dataset["in_chans"], rec["mean"],
                                    rec["std"])
        inputs = AugmentedInputs(self.store, ids, transform, model.prefix, self.device, seed,
                                 self.settings["num_workers"], self.bf16, order_seed=seed,
                                 batch_size=self.settings["batch_size"])  # fit's and TAFT's shuffling
        return ids, inputs, self.store.subset(ids).labels.to(self.device)

    def save(self, state: dict, shard: int, ids: list[str], stats: dict, wall_time_s: float, path: str,
             extra: dict | None = None, model: torch.nn.Module | None = None) -> None:
        """Write one shard model and its record (config, sample ids, seeds; `extra` adds keys).

        `peak_mem_mb` is the job's peak so far (`store.metrics.peak_memory_mb`: CUDA max allocated
        on a GPU, else the process's max RSS). With `model`, the record also counts its training
        memory as the LAST paper's Table 7 does (`job/training_memory.py`: weights, gradients,
        optimizer state, activations; `train_mem_mb`), the figure the claims table compares.
        """
        record = {
            "kind": "trained", "method": self.name, "method_config": self.method_cfg, "train_settings": self.settings,
            "experiment": self.cfg["experiment"], "shards": self.shards, "shard_id": shard, "seed": self.seed,
            "head_seed": self.head_seed, "num_classes": self.num_classes,
            "backbone_digest": state_digest(self.backbone.state_dict()), "num_samples": len(ids), "sample_ids": ids,
            "device": str(self.device), "wall_time_s": wall_time_s, "peak_mem_mb": peak_memory_mb(self.device),
            **(training_memory(model) if model is not None else {}), **(extra or {}), **stats,
        }
        save_model(state, record, path)
        print(f"trained {self.name} shard {shard}/{self.shards} on {len(ids)} samples: loss {stats['train_loss']:.4f}")


def load_job(args: StepArgs, method_cfg: dict | None = None) -> TrainingJob:
    """The job's backbone, samples and manifest, loaded once.

    Args:
        args: the step's arguments.
        method_cfg: settings that stand in for the method's own (e.g. the DP study's).
    """
    cfg, w = args.job_config(), args.wildcards
    method_cfg = method_cfg or cfg["methods"][w["method"]]
    seed = int(w["seed"])
    set_up_job(args.threads, seed)
    backbone, backbone_record = load_backbone(Path(args.input.backbone).parent)
    store = SampleStore(args.input.samples)
    return TrainingJob(
        args=args, cfg=cfg, name=w["method"], method_cfg=method_cfg, settings=train_settings(cfg, method_cfg),
        shards=int(w["shards"]), seed=seed, device=resolve_device(cfg["device"]), backbone=backbone,
        backbone_record=backbone_record, store=store, manifest=pq.read_table(args.input.manifest),
        num_classes=store.num_classes("target"),
        # one head init (and PT = F reset) for every shard of a run: soups and TAFT need a shared start;
        # another for each run seed
        head_seed=init_seed(cfg["seed"], seed),
    )


def main(args: StepArgs) -> None:
    job = load_job(args)
    job.bf16 = use_bf16(job.settings["precision"], job.device)  # non-private training only
    shard = int(args.wildcards["shard"])
    seed = shard_seed(job.seed, shard)
    model = job.new_model()
    t0 = time.perf_counter()
    if job.settings["augment"]["enabled"]:
        ids, features, labels = job.augmented_data(model, shard, seed)
    else:
        ids, features, labels = job.shard_data(model, shard)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=job.bf16):
            stats = get_method(job.method_cfg["kind"]).train(model, features, labels,
                                                             {**job.settings, "method": job.method_cfg}, seed,
                                                             f"{job.name} n{job.shards} shard {shard}")
    finally:
        if isinstance(features, AugmentedInputs):
            features.close()
    job.save(model.trainable_state(), shard, ids, stats, time.perf_counter() - t0, args.output.model, model=model)
