"""What the unlearning study's steps share: one method's backbone, data and cached features,
training on a given list of sample ids exactly as the `train` step does, and test evaluation.

Paper: Bourtoule et al., "Machine Unlearning" (SISA), IEEE S&P 2021; Liu, Soatto et al.,
"Tangent Transformers for Composition, Privacy and Removal", ICLR 2024 (§3.3, §4.4).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.feature_cache import CachedRows, FeatureCache
from pipeline_src.data.sample_store import SampleStore, StoredImages
from pipeline_src.fusion.soup import weighted_average
from pipeline_src.methods.composition import composition_weights
from pipeline_src.methods.evaluation import classification_metrics
from pipeline_src.methods.kinds import kind_of
from pipeline_src.methods.registry import build_tuned_model, get_method
from pipeline_src.methods.training import batched_apply
from pipeline_src.plan.job_settings import init_seed, train_settings
from pipeline_src.runner.runtime import resolve_device
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.train import PREFIX_BATCH
from pipeline_src.store.metrics import metric_rows
from pipeline_src.store.per_image import per_image_rows
from pipeline_src.taft.compose import check_same_linearization, compose_deltas
from pipeline_src.vit.digest import state_digest


@dataclass
class StudyContext:
    """One method of one study job: config, backbone, samples and (optionally) cached features.

    Args:
        cfg: the config as the job may read it (`StepArgs.job_config`: its settings).
        method: the method's name in `methods:`.
        backbone, backbone_record: `backbone.load_backbone` of the pretrained backbone.
        store: the prepared samples.
        features: the method's cached prefix features (all samples-table rows), or None.
        device: where to train and evaluate.
        run_seed: the job's `seed` wildcard (the run whose models it trains or reads).
    """

    cfg: dict
    method: str
    backbone: Any
    backbone_record: dict
    store: SampleStore
    features: FeatureCache | None
    device: torch.device
    run_seed: int = 0

    @property
    def method_cfg(self) -> dict:
        return self.cfg["methods"][self.method]

    @property
    def kind(self) -> str:
        return self.method_cfg["kind"]

    @property
    def num_classes(self) -> int:
        return self.store.num_classes("target")

    @property
    def head_seed(self) -> int:
        """The run's init seed (`job_settings.init_seed`), as the train step's: one per run seed."""
        return init_seed(self.cfg["seed"], self.run_seed)

    def new_model(self):
        # One head init for every model of the run, as the train step does.
        return build_tuned_model(self.backbone, self.method_cfg, self.num_classes, self.head_seed).to(self.device)


def load_context(args: StepArgs) -> StudyContext:
    """The context of a study step whose inputs name `samples`, `backbone` and maybe `features`.

    Its `cfg` is the job's settings and run-only values (`StepArgs.job_config`; the rule's
    `RULE_KEYS` entry in plan/step_settings.py lists what the study steps read), not the config.
    """
    cfg = args.job_config()
    backbone, backbone_record = load_backbone(Path(args.input.backbone).parent)
    feats = FeatureCache(args.input.features) if "features" in args.input._names else None
    return StudyContext(cfg, args.wildcards["method"], backbone, backbone_record, SampleStore(args.input.samples),
                        feats, resolve_device(cfg["device"]), int(args.wildcards["seed"]))


def train_on_ids(ctx: StudyContext, ids: Sequence[str], train_seed: int, desc: str, **record_extra) -> tuple[dict, dict]:
    """Train one model of the context's method on exactly these ids (as the `train` step does).

    Args:
        ids: sorted training sample ids.
        train_seed: batch-order seed (the train step uses seed·1000 + shard).
        desc: progress label.
        record_extra: further record fields (shards, shard_id, ...).
    Returns:
        (trainable state, record with `sample_ids` and `train_time_s`: model build + training).
    """
    ids = list(ids)
    data = ctx.store.subset(ids)
    settings = train_settings(ctx.cfg, ctx.method_cfg)
    t0 = time.perf_counter()
    model = ctx.new_model()
    if ctx.features is not None:  # read one batch at a time, as the train step does
        features = CachedRows(ctx.features, data.rows, ctx.device, blocks=getattr(model, "cache_blocks", None))
    else:  # each drawn batch's images through the frozen prefix, as the train step does without a cache
        features = StoredImages(ctx.store, list(ids), ctx.backbone_record["mean"], ctx.backbone_record["std"],
                                ctx.device, prefix=model.prefix, chunk=PREFIX_BATCH)
    stats = get_method(ctx.kind).train(model, features, data.labels.to(ctx.device),
                                       {**settings, "method": ctx.method_cfg}, train_seed, desc)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    seconds = time.perf_counter() - t0
    record = {
        "kind": "trained", "method": ctx.method, "method_config": ctx.method_cfg, "train_settings": settings,
        "experiment": ctx.cfg["experiment"], "head_seed": ctx.head_seed, "num_classes": ctx.num_classes,
        "backbone_digest": state_digest(ctx.backbone.state_dict()), "num_samples": len(ids), "sample_ids": ids,
        "device": str(ctx.device), "train_time_s": seconds, **stats, **record_extra,
    }
    return model.trainable_state(), record


def compose(ctx: StudyContext, states: list[dict], records: list[dict]) -> tuple[dict, list[float], str]:
    """Compose shard models as the `compose` step does: (state, weights, composition name)."""
    weights = composition_weights(records, ctx.cfg["compose_weights"])
    if kind_of(ctx.kind).tangent:
        check_same_linearization([r["linearization_id"] for r in records])
        return compose_deltas(states, weights), weights, "taft-sum"
    return weighted_average(states, weights), weights, "soup"


class TestSet:
    """The test split's prefix features, computed once per job from images read one batch at a
    time (every model of the job reuses them: O(test split) prefix features, no float images), and
    the labels."""

    def __init__(self, ctx: StudyContext) -> None:
        test = ctx.store.split("target", "test")
        self.ids, self.labels, self.ctx = test.ids, test.labels, ctx
        self.batch_size = ctx.cfg["train"]["eval_batch_size"]
        self.prefix = ctx.store.apply(ctx.new_model().eval().prefix, test.ids, ctx.backbone_record["mean"],
                                      ctx.backbone_record["std"], ctx.device, batch_size=self.batch_size)

    @torch.no_grad()
    def logits(self, state: dict) -> torch.Tensor:
        model = self.ctx.new_model().eval()
        model.load_trainable_state(state)
        return batched_apply(model.forward_from_prefix, self.prefix, self.batch_size).cpu()

    def metrics(self, logits: torch.Tensor) -> dict[str, float]:
        return classification_metrics(logits, self.labels)


def study_context(ctx: StudyContext, *, model: str, shards: int, seed: int, variant: dict, num_samples: int) -> dict:
    """The context columns of one unlearned model's rows (the study's settings in `variant` as JSON)."""
    return dict(experiment=ctx.cfg["experiment"], dataset=ctx.cfg["dataset"]["source"], method=ctx.method,
                kind=ctx.kind, model=model, variant=json.dumps(variant, sort_keys=True), shards=shards,
                shard_id=None, seed=seed, split="test", num_samples=num_samples)


def study_rows(ctx: StudyContext, values: dict[str, float], *, model: str, shards: int, seed: int, variant: dict,
               num_samples: int, wall_time_s: float) -> list[dict]:
    """Metrics rows of one unlearned model (the study's settings go in `variant` as JSON)."""
    context = study_context(ctx, model=model, shards=shards, seed=seed, variant=variant, num_samples=num_samples)
    return metric_rows(values, context=context, device=ctx.device, wall_time_s=wall_time_s)


def study_images(ctx: StudyContext, test: TestSet, logits: torch.Tensor, *, model: str, shards: int, seed: int,
                 variant: dict) -> list[dict]:
    """Per-image rows of one unlearned model on the test split (`store/per_image.py`), with the
    context of its metrics rows, so the claims pair subtract and SISA drop per request.

    Args:
        test: the job's test split.
        logits: (images, classes) of the model, in `test.ids` order.
    """
    context = study_context(ctx, model=model, shards=shards, seed=seed, variant=variant, num_samples=len(test.ids))
    return per_image_rows(logits, test.labels, test.ids, context)
