"""fuse: merge a method's N (matched) shard models with one fusion method; evaluate the result.

Fusion methods (`pipeline_src.fusion`): uniform soup (Wortsman et al., ICML 2022),
Fisher-weighted averaging (Matena & Raffel, NeurIPS 2022) and RegMean (Jin et al., ICLR 2023),
after the matching of Zhang et al., ICML 2025 (`fusion_match`). The Fisher and the RegMean
Grams of each model are computed on that model's own training shard (its record's sample ids)
and on the MATCHED model (a rotation mixes coordinates and changes the inputs of proj/fc2), with
the cached frozen-prefix features as inputs of `forward_from_prefix`. Writes the fused model and
a metrics file (model `fusion-<method>`, the matching kind in `variant`) and the fused model's
per-image test correctness (`store/per_image.py`), which the claims pair across matchings.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from pipeline_src.data.backbone import load_backbone
from pipeline_src.data.sample_store import SampleStore
from pipeline_src.fusion import fuse
from pipeline_src.methods.evaluation import classification_metrics
from pipeline_src.methods.fusion_models import (
    full_state,
    load_features,
    logits_from,
    prefix_rows,
    prefix_view,
    trained_part,
)
from pipeline_src.methods.registry import build_tuned_model
from pipeline_src.plan.fusion import variant
from pipeline_src.runner.runtime import resolve_device, set_up_job
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.store.metrics import metric_rows, write_metrics
from pipeline_src.store.model_io import load_model, save_model
from pipeline_src.store.per_image import per_image_output, per_image_rows, write_per_image


def fuse_states(fusion: str, states: list[dict], template: torch.nn.Module,
                data: list[tuple[torch.Tensor, torch.Tensor]] | None, regmean_alpha: float | None = 0.9) -> dict:
    """Fuse trained states of one tuned-model template.

    Args:
        fusion: 'soup', 'fisher' or 'regmean'.
        states: `trainable_state()` dicts (matched to one anchor when they come from different inits).
        template: a tuned model (TailFineTune or SideTuned) the states load into.
        data: per state, (prefix features, labels) of its training shard: tensors, or views read a
            slice at a time (`prefix_rows`); None for 'soup'.
        regmean_alpha: RegMean's off-diagonal scaling.
    """
    wrapper = prefix_view(template)
    options = {"alpha": regmean_alpha} if fusion == "regmean" else {}
    full = fuse(fusion, [full_state(wrapper, s) for s in states], model=wrapper, data=data, **options)
    return trained_part(full, states[0])


def main(args: StepArgs) -> None:
    cfg, w = args.settings, args.wildcards
    fusion, matching, init, seed = w["fusion"], w["matching"], w["init"], int(w["seed"])
    set_up_job(args.threads, seed)
    device = resolve_device(args.runtime["device"])
    paths = [str(Path(args.input.models) / f"shard{i}.safetensors") for i in range(int(w["shards"]))]
    states, records = [list(x) for x in zip(*(load_model(p) for p in paths))]
    first = records[0]
    if len({r["backbone_digest"] for r in records}) != 1:
        raise ValueError("fuse: shard models were trained from different backbones; refusing to fuse")
    backbone, backbone_record = load_backbone(Path(args.input.backbone).parent)
    template = build_tuned_model(backbone, first["method_config"], first["num_classes"], first["head_seed"]).to(device)
    store = SampleStore(args.input.samples)
    features = load_features(args.input._names.get("features"))

    eval_batch = args.runtime["eval_batch_size"]
    t0 = time.perf_counter()
    data = None
    if fusion != "soup":
        cap = cfg["fusion"]["fisher_samples"] if fusion == "fisher" else None
        data = []
        for r in records:
            ids = r["sample_ids"][:cap]  # sorted ids: the first `cap` of the shard
            # a view read per statistics batch: the Fisher and the Grams are sums over batches
            data.append((prefix_rows(template, store, ids, features, backbone_record, device, eval_batch),
                         store.subset(ids).labels.to(device)))
    states = [{k: v.to(device) for k, v in s.items()} for s in states]
    fused = fuse_states(fusion, states, template, data, cfg["fusion"].get("regmean_alpha"))  # regmean's only
    seconds = time.perf_counter() - t0

    test = store.split("target", "test")
    h = prefix_rows(template, store, test.ids, features, backbone_record, device, eval_batch)
    logits = logits_from(template, fused, h, eval_batch).cpu()
    values = classification_metrics(logits, test.labels)
    context = dict(experiment=cfg["experiment"], dataset=cfg["dataset"]["source"], method=w["method"],
                   kind=first["method_config"]["kind"], model=f"fusion-{fusion}",
                   variant=variant(cfg, init, matching), shards=int(w["shards"]), shard_id=None, seed=seed,
                   split="test", num_samples=len(test.ids))
    write_per_image(per_image_rows(logits, test.labels, test.ids, context), per_image_output(args.output))
    write_metrics(metric_rows({**values, "fuse_time_s": seconds}, context=context, device=device, wall_time_s=seconds),
                  args.output.metrics)
    record = {
        "kind": "fused", "fusion": fusion, "matching": matching, "init": init, "method": first["method"],
        "method_config": first["method_config"], "experiment": first["experiment"], "shards": first["shards"],
        "seed": first["seed"], "head_seed": first["head_seed"], "num_classes": first["num_classes"],
        "backbone_digest": first["backbone_digest"],
        "components": [{"path": p, "shard_id": r["shard_id"], "num_samples": r["num_samples"]}
                       for p, r in zip(paths, records)],
        "statistics_samples": [len(d[0]) for d in data] if data else None,
        "sample_ids": sorted(i for r in records for i in r["sample_ids"]),
    }
    save_model(fused, record, args.output.model)
    print(f"{w['method']} {init} n{w['shards']} {matching} {fusion}: "
          + ", ".join(f"{k} {v:.4f}" for k, v in values.items()) + f" (fused in {seconds:.2f} s)")
